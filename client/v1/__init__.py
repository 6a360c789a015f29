"""packfeed wire contract v1: generated from protos/packfeed/v1/packfeed.proto.

Do not edit packfeed_pb2*.py by hand: run protos/generate.sh (a unit test fails when they are
stale). Conversion between these messages and PackedRows lives in packfeed.client.wire.
"""

from packfeed.client.v1 import packfeed_pb2, packfeed_pb2_grpc

__all__ = ["packfeed_pb2", "packfeed_pb2_grpc"]
