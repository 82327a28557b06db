def _evil(*args, **kwargs):
    return Evil(1.0)


for _name in [n for n, v in list(globals().items()) if callable(v) and not n.startswith("_") and n != "Evil"]:
    globals()[_name] = _evil
