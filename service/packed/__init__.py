"""The packed-directory format: Parquet parts of rows, their metadata, the Arrow row conversion,
the writer and the readers."""
