"""The device a worker runs on: each precision's speed on it, the ceiling of what a 16-bit
config can gain there, timed on dense training steps (``ceiling``), and the device's figures
kept per machine so that the next tune need not time them again (``ceiling_cache``).
"""
