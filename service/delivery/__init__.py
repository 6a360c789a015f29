"""Rows to consumers: the hub that buffers the stream, the manifest that makes delivery exactly
once, the assignment of rows to ranks, the stream sources (a pipeline or a packed directory) and
the gRPC server."""
