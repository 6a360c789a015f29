"""The packed-directory format: Parquet parts of rows, their metadata, the Arrow row conversion,
the writer and the readers (writer.py), and where an output may go on disk or on a store and
what of it is packfeed's (location.py)."""
