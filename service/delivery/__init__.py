"""Rows to consumers: the hub that buffers the stream, the manifest that makes delivery exactly
once, the assignment of rows to ranks, the row stream (a pipeline or a packed directory), the gRPC
server and serve's assembly of them."""
