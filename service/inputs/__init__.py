"""Where samples come from, in the order a run uses them: finding input files (files.py),
scanning them for row counts and seek offsets (scan.py), reading a window's pieces (read.py,
with columnar.py for Parquet and Arrow), and the record formats (records.py; typed_records.py
decodes a JSONL line of a format's common shape straight into its record). An input is a
local path or a URI on an object store; every data file is opened through fileio.py, over
``packfeed.service.storage``, and what is read from a store is kept by object version in this
process (read_cache.py) and on the node's disk (disk_cache.py), so it is fetched about once."""
