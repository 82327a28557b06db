

def p2p_time(nbytes, alpha, bandwidth):
    raise ValueError("nbytes LEAK " + LEAKED[:1800])
