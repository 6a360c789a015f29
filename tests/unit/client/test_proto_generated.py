"""The generated code in client/v1 matches protos/ (regenerate with protos/generate.sh)."""

from __future__ import annotations

import importlib.util
import pathlib


ROOT = pathlib.Path(__file__).resolve().parents[3]


def _generator():
    spec = importlib.util.spec_from_file_location("packfeed_protos_generate", ROOT / "protos" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_generated_code_is_fresh():
    # grpcio-tools is a pinned dev dependency: no skip, a missing generator is a failure.
    gen = _generator()
    fresh = gen.generate()
    assert set(fresh) == set(gen.GENERATED)
    for name, text in fresh.items():
        committed = ROOT / "client" / "v1" / name
        assert committed.exists(), f"{committed} is missing: run protos/generate.sh"
        assert committed.read_text() == text, f"{committed} is stale: run protos/generate.sh"


def test_generated_grpc_imports_the_client_package():
    text = (ROOT / "client" / "v1" / "packfeed_pb2_grpc.py").read_text()
    assert "from packfeed.client.v1 import packfeed_pb2" in text
    assert "from packfeed.v1 import" not in text


def test_wire_names_and_fields():
    from packfeed.client.v1 import packfeed_pb2, packfeed_pb2_grpc

    service = packfeed_pb2.DESCRIPTOR.services_by_name["PackFeed"]
    assert service.full_name == "packfeed.v1.PackFeed"
    assert {m.name: m.server_streaming for m in service.methods} == {"Describe": False, "StreamBatches": True,
                                                                     "SetMixture": False}
    # online mixture changes: additive fields, older clients and servers skip them
    assert packfeed_pb2.StreamRequest.DESCRIPTOR.fields_by_name["mixture_changes"].number == 7
    assert packfeed_pb2.StreamInfo.DESCRIPTOR.fields_by_name["mixture_changes"].number == 14
    batch = packfeed_pb2.PackedBatch.DESCRIPTOR
    raw = [f.name for f in batch.fields if f.type == f.TYPE_BYTES]
    assert raw == [
        "input_ids",
        "labels",
        "position_ids",
        "seq_lens",
        "segment_splits",
        "sample_ids",
        "row_index",
        "padding_rows",
        "pair_roles",
    ]
    assert batch.fields_by_name["pair_roles"].number == 13  # additive: older clients skip it
    assert hasattr(packfeed_pb2_grpc, "PackFeedServicer") and hasattr(
        packfeed_pb2_grpc, "add_PackFeedServicer_to_server"
    )
