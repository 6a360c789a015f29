"""The service's face: every name of ``packfeed.service`` that ``packfeed.trainer`` (and a user's
own driver) may import, and the only service module the trainer imports
(tests/unit/test_import_graph.py holds it). The rest of ``service/`` may move without notice.

    from packfeed.service.face import DataConfig, SampleTokenizer, RowHub, display, join

Grouped by the stage that owns each name (docs/design.md section 1): config and CLI flags,
storage, the tokenizer, Ray and placement, the row stream and its delivery, the packed
directory, faults. A name that would say nothing, or clash, out of its module is renamed here
once: ``faults.adopt`` -> ``adopt_faults``, ``faults.point`` -> ``fault_point``,
``faults.environment`` -> ``faults_environment``, ``scaling.TABLE_KEYS`` -> ``PACKING_TABLE_KEYS``.

Why a module of its own and not ``service/__init__.py``: Python runs a package's ``__init__``
before any of its modules, so a face there would load the whole service (the row stream, Ray's
set-up, the tokenizer) for ``import packfeed.service.storage`` alone, on every packing actor too,
and every service module would sit in a circle with its package (``service/__init__`` ->
``delivery.hub`` -> ``service/__init__``), resolved only by import order. Nothing of the service
imports this module, so it closes no circle. ``packfeed`` loads it with its ``train``
subcommand (the trainer): of the modules it names only packed/ (for trainer/hf.py) was not
loaded already, ~2.5 ms of a ~320 ms start (with bytecode caches, the least of 20 runs).
"""

from __future__ import annotations

from packfeed.service.commands.args import (
    add_data_arguments,
    data_config_from_args,
    load_config_file,
    parse_pairs,
    resolve_output,
)
from packfeed.service.data.config import DataConfig, check_known_keys, close_match
from packfeed.service.delivery.assign import split_micro_batches
from packfeed.service.delivery.feeder import STOP, StreamFeeder, packed_dir_feeder
from packfeed.service.delivery.hub import PIECE_ROWS
from packfeed.service.delivery.mixture_changes import MixtureRefused
from packfeed.service.delivery.row_stream import PackedDir, find_packed_dir
from packfeed.service.faults import adopt as adopt_faults
from packfeed.service.faults import environment as faults_environment
from packfeed.service.faults import point as fault_point
from packfeed.service.packed.arrow_rows import ROW_SCHEMA
from packfeed.service.packed.writer import open_parquet, packed_parts
from packfeed.service.cluster.placement import check_resources, check_selector, check_train_placement
from packfeed.service.pipeline.preflight import RayStart, load_tokenizer_for, preflight
from packfeed.service.cluster.raycluster import Terminated, init_ray, joins_a_cluster, ray_initialised
from packfeed.service.cluster.scaling import TABLE_KEYS as PACKING_TABLE_KEYS
from packfeed.service.cluster.scaling import PackingScaling
from packfeed.service.pipeline.summary import run_failure
from packfeed.service.storage import StorageError, delete_prefix, display, exists, is_remote, join, resolve, write_bytes_atomic
from packfeed.service.storage.tree import (
    download_dir,
    find,
    holds,
    publish_dir,
    read_text,
    remove_names,
    upload_dir,
    write_json,
)
from packfeed.service.tokenize.hf_hub import hub_kwargs, hub_unreachable, hub_unreachable_error, looks_local
from packfeed.service.tokenize.samples import load_tokenizer

__all__ = [
    # config and the flags `packfeed train` shares with pack and serve (commands/args.py)
    "DataConfig", "check_known_keys", "close_match",
    "add_data_arguments", "data_config_from_args", "load_config_file", "parse_pairs", "resolve_output",
    # storage: every path a URI (storage/)
    "StorageError", "delete_prefix", "display", "exists", "is_remote", "join", "resolve", "write_bytes_atomic",
    "download_dir", "find", "holds", "publish_dir", "read_text", "remove_names", "upload_dir", "write_json",
    # the tokenizer and the Hugging Face Hub (tokenize/)
    "load_tokenizer", "load_tokenizer_for",
    "hub_kwargs", "hub_unreachable", "hub_unreachable_error", "looks_local",
    # the checks before Ray, Ray and placement (data/, pipeline/)
    "RayStart", "preflight",
    "Terminated", "init_ray", "joins_a_cluster", "ray_initialised", "run_failure",
    "PACKING_TABLE_KEYS", "PackingScaling",
    "check_resources", "check_selector", "check_train_placement",
    # the row stream and its delivery to ranks (delivery/)
    "PIECE_ROWS", "STOP", "StreamFeeder", "packed_dir_feeder", "MixtureRefused", "split_micro_batches",
    "PackedDir", "find_packed_dir",
    # the packed directory (packed/)
    "ROW_SCHEMA", "open_parquet", "packed_parts",
    # faults on purpose (faults.py)
    "adopt_faults", "fault_point", "faults_environment",
]
