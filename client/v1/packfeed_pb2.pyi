from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamInfo(_message.Message):
    __slots__ = ("seq_len", "tokenizer_name", "vocab_size", "pad_id", "config_hash", "rows_per_epoch", "ignore_index", "wire_version")
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_NAME_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAD_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    IGNORE_INDEX_FIELD_NUMBER: _ClassVar[int]
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    seq_len: int
    tokenizer_name: str
    vocab_size: int
    pad_id: int
    config_hash: str
    rows_per_epoch: int
    ignore_index: int
    wire_version: int
    def __init__(self, seq_len: _Optional[int] = ..., tokenizer_name: _Optional[str] = ..., vocab_size: _Optional[int] = ..., pad_id: _Optional[int] = ..., config_hash: _Optional[str] = ..., rows_per_epoch: _Optional[int] = ..., ignore_index: _Optional[int] = ..., wire_version: _Optional[int] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("rank", "world_size", "batch_rows", "cursor", "expected_config_hash", "expected_seq_len")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    rank: int
    world_size: int
    batch_rows: int
    cursor: int
    expected_config_hash: str
    expected_seq_len: int
    def __init__(self, rank: _Optional[int] = ..., world_size: _Optional[int] = ..., batch_rows: _Optional[int] = ..., cursor: _Optional[int] = ..., expected_config_hash: _Optional[str] = ..., expected_seq_len: _Optional[int] = ...) -> None: ...

class PackedBatch(_message.Message):
    __slots__ = ("num_rows", "seq_len", "input_ids", "labels", "position_ids", "seq_lens", "segment_splits", "sample_ids", "row_index", "padding_rows", "cursor", "step")
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    POSITION_IDS_FIELD_NUMBER: _ClassVar[int]
    SEQ_LENS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_SPLITS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    ROW_INDEX_FIELD_NUMBER: _ClassVar[int]
    PADDING_ROWS_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    num_rows: int
    seq_len: int
    input_ids: bytes
    labels: bytes
    position_ids: bytes
    seq_lens: bytes
    segment_splits: bytes
    sample_ids: bytes
    row_index: bytes
    padding_rows: bytes
    cursor: int
    step: int
    def __init__(self, num_rows: _Optional[int] = ..., seq_len: _Optional[int] = ..., input_ids: _Optional[bytes] = ..., labels: _Optional[bytes] = ..., position_ids: _Optional[bytes] = ..., seq_lens: _Optional[bytes] = ..., segment_splits: _Optional[bytes] = ..., sample_ids: _Optional[bytes] = ..., row_index: _Optional[bytes] = ..., padding_rows: _Optional[bytes] = ..., cursor: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...
