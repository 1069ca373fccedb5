"""The lab queue page: every device of this host, the waiting trials in the order they are expected to run
with why each waits and when it should start, and each team's share of device time against its weight."""
