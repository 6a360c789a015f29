from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamInfo(_message.Message):
    __slots__ = ("seq_len", "tokenizer_name", "vocab_size", "pad_id", "config_hash", "total_rows", "ignore_index", "wire_version", "epochs", "epoch_rows", "sources", "samples_per_epoch", "max_batch_rows", "mixture_changes")
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_NAME_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAD_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROWS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_INDEX_FIELD_NUMBER: _ClassVar[int]
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    MIXTURE_CHANGES_FIELD_NUMBER: _ClassVar[int]
    seq_len: int
    tokenizer_name: str
    vocab_size: int
    pad_id: int
    config_hash: str
    total_rows: int
    ignore_index: int
    wire_version: int
    epochs: int
    epoch_rows: _containers.RepeatedScalarFieldContainer[int]
    sources: _containers.RepeatedCompositeFieldContainer[SourceInfo]
    samples_per_epoch: int
    max_batch_rows: int
    mixture_changes: _containers.RepeatedCompositeFieldContainer[MixtureChange]
    def __init__(self, seq_len: _Optional[int] = ..., tokenizer_name: _Optional[str] = ..., vocab_size: _Optional[int] = ..., pad_id: _Optional[int] = ..., config_hash: _Optional[str] = ..., total_rows: _Optional[int] = ..., ignore_index: _Optional[int] = ..., wire_version: _Optional[int] = ..., epochs: _Optional[int] = ..., epoch_rows: _Optional[_Iterable[int]] = ..., sources: _Optional[_Iterable[_Union[SourceInfo, _Mapping]]] = ..., samples_per_epoch: _Optional[int] = ..., max_batch_rows: _Optional[int] = ..., mixture_changes: _Optional[_Iterable[_Union[MixtureChange, _Mapping]]] = ...) -> None: ...

class SourceInfo(_message.Message):
    __slots__ = ("name", "rows", "samples_per_epoch", "planned_share", "first_sample_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PLANNED_SHARE_FIELD_NUMBER: _ClassVar[int]
    FIRST_SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    rows: int
    samples_per_epoch: int
    planned_share: float
    first_sample_id: int
    def __init__(self, name: _Optional[str] = ..., rows: _Optional[int] = ..., samples_per_epoch: _Optional[int] = ..., planned_share: _Optional[float] = ..., first_sample_id: _Optional[int] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("rank", "world_size", "batch_rows", "cursor", "expected_config_hash", "expected_seq_len", "mixture_changes")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    MIXTURE_CHANGES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    world_size: int
    batch_rows: int
    cursor: int
    expected_config_hash: str
    expected_seq_len: int
    mixture_changes: _containers.RepeatedCompositeFieldContainer[MixtureChange]
    def __init__(self, rank: _Optional[int] = ..., world_size: _Optional[int] = ..., batch_rows: _Optional[int] = ..., cursor: _Optional[int] = ..., expected_config_hash: _Optional[str] = ..., expected_seq_len: _Optional[int] = ..., mixture_changes: _Optional[_Iterable[_Union[MixtureChange, _Mapping]]] = ...) -> None: ...

class SetMixtureRequest(_message.Message):
    __slots__ = ("weights", "step", "cursor")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    weights: _containers.ScalarMap[str, float]
    step: int
    cursor: int
    def __init__(self, weights: _Optional[_Mapping[str, float]] = ..., step: _Optional[int] = ..., cursor: _Optional[int] = ...) -> None: ...

class MixtureChange(_message.Message):
    __slots__ = ("step", "from_sample", "window", "weights", "schedule_index", "consumer_window", "consumer_sample")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    FROM_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_WINDOW_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    step: int
    from_sample: int
    window: int
    weights: _containers.ScalarMap[str, float]
    schedule_index: int
    consumer_window: int
    consumer_sample: int
    def __init__(self, step: _Optional[int] = ..., from_sample: _Optional[int] = ..., window: _Optional[int] = ..., weights: _Optional[_Mapping[str, float]] = ..., schedule_index: _Optional[int] = ..., consumer_window: _Optional[int] = ..., consumer_sample: _Optional[int] = ...) -> None: ...

class PackedBatch(_message.Message):
    __slots__ = ("num_rows", "seq_len", "input_ids", "labels", "position_ids", "seq_lens", "segment_splits", "sample_ids", "row_index", "padding_rows", "cursor", "step", "pair_roles")
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
    PAIR_ROLES_FIELD_NUMBER: _ClassVar[int]
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
    pair_roles: bytes
    def __init__(self, num_rows: _Optional[int] = ..., seq_len: _Optional[int] = ..., input_ids: _Optional[bytes] = ..., labels: _Optional[bytes] = ..., position_ids: _Optional[bytes] = ..., seq_lens: _Optional[bytes] = ..., segment_splits: _Optional[bytes] = ..., sample_ids: _Optional[bytes] = ..., row_index: _Optional[bytes] = ..., padding_rows: _Optional[bytes] = ..., cursor: _Optional[int] = ..., step: _Optional[int] = ..., pair_roles: _Optional[bytes] = ...) -> None: ...
