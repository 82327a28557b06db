"""Running real ranks: the no-hang launcher, the byte counter, the Lab 03 benchmark, the lessons' demos."""
