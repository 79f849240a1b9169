"""Run configuration: YAML or flags, validated by pydantic, with errors that name the bad key.

One ``RunConfig`` describes a run. Sections shared by all protocols (dataset, partition, model,
train, eval, backend, network) are typed here; the ``protocol`` section is validated by the chosen
protocol's own ``Options`` model, found by name in ``registry``, so each protocol owns its settings.
``identity`` holds a run's identity (flat keys, the config hash, what a resume may change).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ..errors import ConfigError, DataError
from ..options import Settings
from ..privacy.config import PrivacyConfig, PrivacySection
from .registry import REGISTRY, paper_training, protocol_class

DEFAULT_PROTOCOL = "fedavg"


def protocol_options(section: dict[str, Any]) -> BaseModel:
    """A protocol section validated by its protocol's own options model (one line naming a bad key)."""
    if "name" not in section:
        raise ConfigError(f"invalid config: protocol.name is required; allowed: {', '.join(sorted(REGISTRY))}")
    cls = protocol_class(section["name"])
    try:
        return cls.Options.model_validate({**section, "name": str(section["name"]).lower()})
    except ValidationError as err:
        raise ConfigError(describe(err, prefix="protocol.")) from None


class Section(Settings):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class DatasetConfig(Section):
    name: str = "synthetic"
    data_root: str | None = None
    split: str = "default"
    options: dict[str, Any] = Field(default_factory=dict, description="synthetic generator settings")

    @field_validator("options")
    @classmethod
    def _split_sizes(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Split sizes are counts, refused when negative whatever the split (any split may become random)."""
        from ..data.splits import SPLIT_SIZES, check_split_sizes

        try:
            check_split_sizes(**{key: options[key] for key in SPLIT_SIZES if key in options})
        except DataError as err:
            raise ValueError(str(err)) from None
        return options


class PartitionConfig(Section):
    num_clients: int = Field(10, ge=1)
    method: str = Field("metis", description=(
        "horizontal: metis|louvain|dirichlet|dirichlet-client|random|stratified; vertical: contiguous|random"))
    alpha: float = Field(0.5, gt=0, description="Dirichlet label-skew concentration")
    edge_drop: float = Field(0.0, ge=0, lt=1, description="horizontal: drop ratio of intra-client edges")
    cross_edge_drop: float = Field(0.0, ge=0, lt=1, description="horizontal: drop ratio of cross-client edges")
    drop_unit: Literal["pair", "entry"] = Field("pair", description=(
        "horizontal: what one drop draw decides: a node pair, or each direction (a pair stays while either does)"))
    client_nodes: Literal["all", "train", "train+val", "non-test"] = Field("all", description=(
        "horizontal: which nodes clients own; the others (held out) are owned by no client"))
    edge_keep: float = Field(0.8, gt=0, le=1, description="vertical: share of edges each client keeps")
    label_holder: int | None = Field(None, ge=0, description="vertical: the only client holding labels")


class ModelConfig(Section):
    name: str = "gcn"
    hidden: int = Field(64, ge=1)
    layers: int = Field(2, ge=1)
    dropout: float = Field(0.5, ge=0, lt=1)
    options: dict[str, Any] = Field(default_factory=dict, description="backbone extras, e.g. heads for GAT")


class TrainConfig(Section):
    rounds: int = Field(100, ge=1)
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = Field(0.01, gt=0)
    weight_decay: float = Field(5e-4, ge=0)


class EvalConfig(Section):
    every: int = Field(1, ge=1)
    target_val_accuracy: float | None = Field(None, gt=0, le=1)
    target_test_accuracy: float | None = Field(None, gt=0, le=1, description=(
        "a target on test accuracy instead, for a paper that states its target so (GLASU's Table 4); "
        "a run stopped by it has looked at the test split"))
    stop_at_target: bool = False

    @model_validator(mode="after")
    def _target(self):
        if self.target_val_accuracy is not None and self.target_test_accuracy is not None:
            raise ValueError("set one of target_val_accuracy and target_test_accuracy, not both")
        if self.stop_at_target and self.target() is None:
            raise ValueError("stop_at_target needs target_val_accuracy or target_test_accuracy")
        return self

    def target(self) -> tuple[str, float] | None:
        """The metric a target applies to and its value, if one is set."""
        if self.target_test_accuracy is not None:
            return "test_accuracy", self.target_test_accuracy
        return None if self.target_val_accuracy is None else ("val_accuracy", self.target_val_accuracy)


class PartyPlacement(Section):
    node: str | None = Field(None, description=(
        "a Ray custom resource the party's node was started with (ray start --resources); the party runs there"))
    data: str | None = Field(None, description="the party's shard file on its node (default <shards>/<name>.pt)")


class BackendConfig(Section):
    name: Literal["local", "ray", "flower"] = "local"
    shards: str | None = Field(None, description=(
        "a folder written by `fedgl partition`: the driver loads no dataset, each party loads its own shard"))
    parties: dict[str, PartyPlacement] = Field(default_factory=dict, description=(
        "per party (by name; `evaluator` is the scoring harness): the node it is pinned to and its shard file"))
    address: str | None = Field(None, description="an existing Ray cluster; default starts a local one")
    connect_timeout_s: float = Field(30.0, gt=0, description="how long to wait for the Ray cluster at address")
    ray_auth: Literal["token", "none"] = Field("token", description=(
        "token: the Ray a run starts or joins must enforce Ray's token authentication (RAY_AUTH_MODE=token); "
        "none: allow one without it, where anyone who reaches its ports can run code and read every party"))
    actors: int | None = Field(None, ge=1, description="Ray actors hosting the clients; default one per core")
    on_client_failure: Literal["stop", "retry", "skip"] = Field("stop", description=(
        "a lost party: stop (resumable), retry (recreate it and restart from the last checkpoint), or skip "
        "(continue without it, where the protocol allows)"))
    max_retries: int = Field(3, ge=0, description="retries of one run under on_client_failure: retry")


class NetworkConfig(Section):
    bandwidth_mbps: float = Field(1000.0, gt=0)
    latency_ms: float = Field(1.0, ge=0)
    compute: Literal["cpu", "measured", "ignore"] = Field("cpu", description=(
        "compute on the simulated clock: CPU seconds (load-independent), measured elapsed seconds, or none"))


class RunConfig(Section):
    seed: int = Field(0, ge=0, lt=2**32, description="seeds every random draw of the run")
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    protocol: dict[str, Any] = Field(default_factory=lambda: {"name": DEFAULT_PROTOCOL})
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    backend: BackendConfig = Field(default_factory=BackendConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    checkpoint_every: int = Field(0, ge=0, description="rounds between checkpoints; 0 = none")
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$", description=(
        "where every party computes: cpu, cuda (the current CUDA device) or cuda:N; messages cross as CPU tensors"))
    threads: int | None = Field(1, ge=1, le=1024, description=(
        "torch threads per party process; 1 keeps parties from oversubscribing the cores; null = torch's default"))
    privacy: PrivacySection = Field(default_factory=PrivacyConfig, description=(
        "secure aggregation and differential privacy, where the protocol implements them"))
    logging: list[Literal["curves", "tensorboard", "mlflow", "wandb"]] = Field(default_factory=list, description=(
        "curves: draw curves.png at the end of the run (fedgl report draws it for any run later); tensorboard, "
        "mlflow, wandb: experiment trackers that receive the metrics of every evaluated round, the config, "
        "summary and curves.png"))

    @field_validator("protocol")
    @classmethod
    def _protocol_known(cls, section: dict[str, Any]) -> dict[str, Any]:
        """Validate with the protocol's own options model and store its complete, defaulted form."""
        return protocol_options({"name": DEFAULT_PROTOCOL, **section}).model_dump()

    @model_validator(mode="after")
    def _paper_sections(self):
        """``model`` and ``partition`` settings the config leaves unset take what the protocol needs at its
        defaults (LLCG: GraphSAGE; FedAAS: clients holding training nodes; nFedGNN: a 256-value latent), so
        that ``fedgl run --protocol P --dataset D`` runs and learns; given settings are kept, and refused as
        before where they do not fit."""
        for section, values in protocol_class(self.protocol_name).paper_sections(self.options()).items():
            current = getattr(self, section)
            unset = {key: value for key, value in values.items() if key not in current.model_fields_set}
            if unset:
                self.__dict__[section] = current.model_copy(update=unset)  # not an assignment: no re-validation
        return self

    @model_validator(mode="after")
    def _paper_training(self):
        """``train`` settings the config leaves unset take the protocol's paper values where it has its
        own (FedAAS with Adam: 0.001 without decay; nFedGNN and CNFGNN with GCN and Adam: 0.1), else the
        shared defaults, which suit full-batch GCN training (FedAAS's ten fresh-Adam steps per round at
        0.01 with decay 5e-4 left it at chance on CiteSeer). They stay unset, so a config made from this
        one with another protocol or model takes that one's values; the given ``train`` is not changed."""
        given = self.train.model_fields_set
        paper = paper_training(self.protocol_name, self.model.name, self.train.optimizer)
        unset = {key: paper.get(key, field.default) for key, field in TrainConfig.model_fields.items()
                 if key not in given}
        if any(getattr(self.train, key) != value for key, value in unset.items()):
            self.__dict__["train"] = TrainConfig.model_construct(  # not an assignment: no re-validation
                _fields_set=set(given), **self.train.model_dump(include=given), **unset)
        return self

    @property
    def protocol_name(self) -> str:
        return str(self.protocol.get("name", "")).lower()

    def options(self) -> BaseModel:
        return protocol_options(self.protocol)


def describe(err: ValidationError, prefix: str = "") -> str:
    """One line naming the first bad key, the problem and the value given. A key that takes one of several
    kinds of value (``int | Literal["adaptive", "never"]``) gets every kind it takes, in words, instead of
    pydantic's first branch and its name in the key (``interval.int``)."""
    errors = err.errors()
    first, expected = errors[0], None
    branch = next((i for i, part in enumerate(first["loc"]) if _is_branch(part)), None)
    if branch is not None:  # the alternatives: the errors of the same key's other branches
        options = [e for e in errors if e["loc"][:branch] == first["loc"][:branch] and len(e["loc"]) > branch
                   and _is_branch(e["loc"][branch])]
        closer = [e for e in options if len(e["loc"]) > branch + 1 or not _wrong_kind(e["type"])]
        first = closer[0] if closer else first  # e.g. a list with a bad item: that item, not "not an integer"
        if not closer:
            expected = list(dict.fromkeys(word for e in options for word in _kind(e["loc"][branch], e)))
    # A check of a whole section (a model validator) has no key of its own: the section is named.
    where = (prefix + ".".join(str(p) for p in first["loc"] if not _is_branch(p))).rstrip(".") or "config"
    got = first.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
    if expected:
        words = ", ".join(expected[:-1]) + f" or {expected[-1]}" if len(expected) > 1 else expected[0]
        return f"invalid config: {where}: expected {words}{shown}"
    message = "unknown key" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")
    return f"invalid config: {where}: {message}{shown}"


_KINDS = {"int": "an integer", "float": "a number", "bool": "true, false", "str": "a text",
          "list[int]": "a list of integers", "list[float]": "a list of numbers", "list[str]": "a list of texts"}


def _is_branch(part: Any) -> bool:
    """Whether a part of an error's key is pydantic's name for a branch of a union (``int``,
    ``literal['auto']``, ``function-after[...]``, a model's class name), not a config key."""
    return isinstance(part, str) and (part in _KINDS or "[" in part or part.endswith(("Config", "Options")))


def _wrong_kind(kind: str) -> bool:
    """Whether an error only says the value is of another kind than its branch takes."""
    return kind.endswith(("_parsing", "_type")) or kind in ("literal_error", "model_attributes_type")


def _kind(branch: str, error: dict[str, Any]) -> list[str]:
    """A union branch in words: the kinds or the values it takes."""
    if error["type"] == "literal_error":  # pydantic's "'a', 'b' or 'c'"
        return error["ctx"]["expected"].replace(" or ", ", ").split(", ")
    return _KINDS.get(branch, "a mapping of settings" if error["type"].startswith(("model", "dict")) else branch
                      ).split(", ")


def build_config(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe(err)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (the second would silently win)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:  # as written: a merge (<<) brings keys a mapping may override
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key_node.value!r} is given twice",
                                                            key_node.start_mark)
                seen.add(key_node.value)
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a folder, not a config file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not a text (UTF-8 YAML) file") from None
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror or err}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"malformed YAML in {path}{at}: {getattr(err, 'problem', err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"malformed config {path}: the top level must be a mapping of sections")
    return data


def parse_override(assignment: str) -> tuple[str, Any]:
    """``section.key=value`` as (dotted key, value); the value is parsed as YAML (numbers, lists, null),
    or kept as the text it is when it is not YAML."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {assignment!r} must look like section.key=value")
    if not all(part.strip() for part in key.split(".")):
        raise ConfigError(f"override {assignment!r} has an empty part in its key {key.strip()!r}")
    try:
        return key.strip(), yaml.safe_load(raw)
    except yaml.YAMLError:
        return key.strip(), raw


def set_key(data: dict[str, Any], parts: list[str], value: Any, label: str) -> None:
    """Set ``value`` at the path ``parts`` of a config mapping, making sections on the way; ``label``
    names the override in the error when a step of the path is not a section."""
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {label}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``section.key=value`` override."""
    key, value = parse_override(assignment)
    set_key(data, key.split("."), value, repr(assignment))


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    data = read_yaml(path) if path else {}
    for assignment in overrides:
        apply_override(data, assignment)
    return build_config(data)
