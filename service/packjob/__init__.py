"""`packfeed pack`'s driver: the run, its head start (the driver packs the first windows while
Ray starts), the checks beside Ray's start, the report."""
