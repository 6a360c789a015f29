"""Where samples come from, in the order a run uses them: finding input files (files.py),
scanning them for row counts and seek offsets (scan.py), reading a window's pieces (read.py,
with columnar.py for Parquet and Arrow), and the record formats (records.py). Every data file
is opened through fileio.py."""
