"""The lab beside the rltok library: the instruments, study steps and result records that only the
studies use. It depends on rltok one way: nothing in rltok imports it (a test holds to that)."""
