"""Running one configured federation: rounds, evaluation, target stop, checkpoints, results.

The guard a user's request passes first (the results folder, a resume) is ``session``; what a run is
(its flat keys and hash) is ``config.identity``."""

from __future__ import annotations

import math
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import yaml

from .comm import NetworkModel, make_transport
from .comm.ledger import SERVER
from .config import RunConfig
from .config.candidates import search_space
from .config.identity import config_hash, config_hashes, flat_config, resumable_change
from .data import load_data
from .deployment import check_placements, deploy
from .device import to_wire
from .errors import ConfigError, PartyFailure, RunFailed
from .files import load_tensors, make_folder, write_atomically
from .evaluation import Evaluator
from .protocols import protocol_class
from .progress import RunProgress
from .results import (CONFIG, FINISHED, LEDGER, METRICS, PLOT, SUMMARY, best_row, plot_curves, read_jsonl,
                      round_unit, write_json, write_jsonl)
from .tracking import Tracking

CHECKPOINT = "checkpoint.pt"


@dataclass
class RunResult:
    """What a finished run left: its folder, ``summary.json`` as a dict and its metric rows."""

    out_dir: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]

    @property
    def config_path(self) -> Path:
        """The resolved config; ``fedgl.run(result.config_path)`` repeats the run."""
        return self.out_dir / CONFIG

    def ledger(self) -> list[dict[str, Any]]:
        """The ledger rows: bytes and messages per (round, sender, receiver, kind, method)."""
        return read_jsonl(self.out_dir / LEDGER)

    def metrics_frame(self):
        """The metric rows as a pandas DataFrame (pandas is not a dependency: refused in one line without it)."""
        try:
            import pandas
        except ImportError:
            raise ConfigError("metrics_frame needs pandas, which fedgl does not install: pip install pandas") from None
        return pandas.DataFrame(self.metrics)


def default_out_dir(cfg: RunConfig, parent: str | Path = "results",
                    hint: str = "name another folder or move it") -> Path:
    """A new folder named for the run; runs started in the same second get a numbered suffix. A file
    where ``parent`` goes is refused in one line ending with ``hint``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(parent) / f"{cfg.protocol_name}-{cfg.dataset.name.lower()}-seed{cfg.seed}-{stamp}"
    make_folder(parent, hint=hint)
    for n in range(1, 10_000):
        folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise ConfigError(f"cannot find a free results folder next to {base}")


class StopAfterRound:
    """The first Ctrl-C asks the run to stop after the round in progress (a round cut short would
    leave the parties' states mid-round); a second one interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> "StopAfterRound":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class Run:
    """One federation from a config: build it, train it round by round, write its folder."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path | None = None, *, data=None):
        self.cfg = cfg
        if search_space(cfg):
            raise ConfigError(f"{cfg.protocol_name}: a setting left to auto is chosen among whole runs; run the config "
                              f"with fedgl run, fedgl.run or fedgl.search.open_run")
        self.out_dir = Path(out_dir) if out_dir else default_out_dir(cfg)
        self.tracking = Tracking(cfg.logging, self.out_dir)  # fails here, before training, if a package is missing
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        b = cfg.backend
        if b.on_client_failure == "skip" and not protocol_class(cfg.protocol_name).can_skip_parties:
            raise ConfigError(f"backend.on_client_failure: skip: {cfg.protocol_name} cannot continue without a "
                              f"client; use stop or retry")
        if b.on_client_failure == "retry" and not cfg.checkpoint_every:
            raise ConfigError("backend.on_client_failure: retry restarts from the last checkpoint; "
                              "set checkpoint_every")
        if not b.shards:
            data = data if data is not None else load_data(cfg)
        options = ({"address": b.address, "actors": b.actors, "connect_timeout_s": b.connect_timeout_s,
                    "nodes": {name: p.node for name, p in b.parties.items() if p.node}, "auth": b.ray_auth}
                   if b.name == "ray" else {})
        self.transport = make_transport(b.name, NetworkModel(**cfg.network.model_dump()), cfg.device, **options)
        self.recorder = None
        try:  # a run refused from here on stops the parties it started (a notebook's Ray stays clean)
            if cfg.privacy.record_messages:  # what crossed, for ``fedgl audit``
                from .privacy.record import MessageRecorder

                self.recorder = MessageRecorder(self.out_dir / "messages")
                self.transport.observers.append(self.recorder)
            if b.shards:  # deployment: the driver holds the manifest and the server's state, never the dataset
                self.protocol, self.evaluator = deploy(cfg, self.transport)
            else:
                self.evaluator = Evaluator(data)
                self.protocol = protocol_class(cfg.protocol_name)(cfg, self.transport)
                self.protocol.setup(data)
                check_placements(b.parties, self.transport.parties)
            self.protocol.start()
        except BaseException:
            self.close()
            raise
        self.title = f"{cfg.protocol_name} on {cfg.dataset.name}"  # the progress bar's
        self.metrics: list[dict[str, Any]] = []
        self.start_round = 1
        self.completed = 0
        self.wall_offset = 0.0
        self.lost: list[dict[str, Any]] = []  # parties dropped under on_client_failure: skip
        self.retries = 0

    def close(self) -> None:
        """Stop the parties and the message recorder."""
        self.transport.close()
        if self.recorder is not None:
            self.recorder.close()

    # ---- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(self, round_index: int, wall: float) -> None:
        """Each party writes its own state into ``parties-<round>/`` where it lives; then the server's
        state goes to ``checkpoint.pt``, whose atomic rename commits the checkpoint; older party
        folders are removed after. A kill at any moment leaves one complete checkpoint."""
        parties = self.out_dir / f"parties-{round_index}"
        parties.mkdir(mode=0o700, exist_ok=True)  # the parties' own state: not for other users of the machine
        self.transport.save_parties(parties)
        state = {
            "format": "fedgl-checkpoint-2",
            "config": flat_config(self.cfg),
            "config_hash": config_hash(self.cfg),
            "round": round_index,
            "protocol": to_wire(self.protocol.state_dict()),  # on the CPU: the file reads on any machine
            "parties": parties.name,
            "ledger": self.transport.ledger.state_dict(),
            "clock": self.transport.clock.now,
            "compute_s": dict(self.transport.compute_s),  # each party's CPU seconds so far, for the summary
            "rng": torch.get_rng_state(),
            # a server computing on a GPU (the centralized reference, nFedGNN's layers) draws there
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
            "metrics": self.metrics,
            "wall": wall,
        }
        write_atomically(self.out_dir / CHECKPOINT, lambda fh: torch.save(state, fh))
        for old in self.out_dir.glob("parties-*"):
            if old != parties:
                shutil.rmtree(old, ignore_errors=True)

    def resume(self) -> bool:
        """Continue from the folder's checkpoint, which must come from this config (up to
        ``config.identity.RESUMABLE_CHANGES``). Every checkpoint file holds tensors and plain data only and is read
        with ``weights_only=True``: a file that would run code when loaded is refused with one line."""
        path = self.out_dir / CHECKPOINT
        if not path.exists():
            return False
        state = load_tensors(path, "cannot resume: the checkpoint")  # any unreadable file: torn, truncated, foreign
        if not isinstance(state, dict) or state.get("format") != "fedgl-checkpoint-2":
            raise ConfigError(f"cannot resume: {path} is not a fedgl checkpoint")
        if state["config_hash"] not in config_hashes(self.cfg):
            now = flat_config(self.cfg)
            differing = sorted(k for k in set(now) | set(state["config"])
                               if not resumable_change(k) and now.get(k) != state["config"].get(k))
            raise ConfigError(f"cannot resume: the checkpoint in {self.out_dir} was made with a different config "
                              f"({', '.join(differing)})")
        made_on = state["config"].get("device", "cpu")
        if made_on != self.cfg.device:  # a shard folder runs anywhere, but random states belong to a device
            raise ConfigError(f"cannot resume: the checkpoint in {self.out_dir} was made with device: {made_on}; "
                              f"resume it there (random states and their draws differ between devices)")
        if state["round"] > self.cfg.train.rounds:
            raise ConfigError(f"cannot resume: the checkpoint in {self.out_dir} is at round {state['round']}, past "
                              f"train.rounds = {self.cfg.train.rounds}")
        self.transport.load_parties(self.out_dir / state["parties"])  # each party names its own bad file
        self.protocol.load_state_dict(state["protocol"])
        self.transport.ledger.load_state_dict(state["ledger"])
        self.transport.clock.now = state["clock"]
        self.transport.compute_s = dict(state.get("compute_s", {}))  # older checkpoints did not keep it
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.metrics = state["metrics"]
        self.start_round = state["round"] + 1
        self.wall_offset = state["wall"]
        return True

    # ---- the loop ---------------------------------------------------------------------------------
    def evaluate(self, round_index: int, stats: dict[str, float], wall: float) -> dict[str, Any]:
        with self.transport.evaluation():
            scores = self.evaluator.score(self.protocol.predict(self.evaluator))
        ledger = self.transport.ledger
        row = {
            "round": round_index,
            **{k: float(v) for k, v in stats.items()},
            **scores,
            "bytes_total": ledger.total(),
            "bytes_round": ledger.round_bytes(round_index),
            "sim_time_s": self.transport.clock.now,
            "wall_time_s": wall,
        }
        self.metrics.append(row)
        self.tracking.log_round(round_index, row, ledger.by_kind(include_eval=False))
        return row

    def execute(self, progress: bool = True) -> RunResult:
        """Train the remaining rounds and write the folder. On Ctrl-C the last completed round is
        checkpointed and a summary marked unfinished is written before the interrupt propagates."""
        cfg = self.cfg
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / FINISHED).unlink(missing_ok=True)
        (self.out_dir / CONFIG).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        target = cfg.eval.target()
        started = time.perf_counter() - self.wall_offset
        self.completed = self.start_round - 1
        self.tracking.start(flat_config(cfg), self.start_round)
        try:
            with RunProgress(self.title, cfg.train.rounds, self.start_round - 1,
                             enabled=progress) as bar, StopAfterRound() as stop:
                r = self.start_round
                while r <= cfg.train.rounds:
                    self.transport.set_round(r)
                    self.transport.idle()
                    try:
                        stats = self.protocol.train_round(r)
                    except PartyFailure as failure:
                        r = self.recover(failure, r, time.perf_counter() - started)
                        continue
                    row = None
                    if r % cfg.eval.every == 0 or r == cfg.train.rounds:
                        row = self.evaluate(r, stats, time.perf_counter() - started)
                        if target is not None and cfg.eval.stop_at_target and row[target[0]] >= target[1]:
                            bar.update(r, row)
                            break
                    if cfg.checkpoint_every and r % cfg.checkpoint_every == 0:
                        self.save_checkpoint(r, time.perf_counter() - started)
                    self.completed = r
                    bar.update(r, row)
                    if stop.requested:
                        self.interrupted(time.perf_counter() - started)
                        raise KeyboardInterrupt
                    r += 1
            wall = time.perf_counter() - started  # training and evaluation, not tearing the parties down
        except BaseException:
            self.tracking.finish(None, [])  # no-op when the partial summary was written and tracked
            raise
        finally:
            self.close()
        summary = self.summarize(wall)
        self.write(summary)
        (self.out_dir / FINISHED).write_text(config_hash(cfg) + "\n")
        return RunResult(self.out_dir, summary, self.metrics)

    def recover(self, failure: PartyFailure, r: int, wall: float) -> int:
        """Apply ``backend.on_client_failure`` to parties lost during round ``r``; returns the round
        to run next. ``skip``: the protocol continues without them and round ``r`` is run again;
        ``retry``: the lost parties are recreated and the whole federation restarts from the last
        checkpoint (so the run equals an uninterrupted one); ``stop``: a partial summary, then one
        line saying how to resume."""
        policy = self.cfg.backend.on_client_failure
        checkpoint = self.out_dir / CHECKPOINT
        if policy == "skip":
            self.protocol.drop_parties(failure.parties)
            for party in failure.parties:
                self.lost.append({"party": party, "round": r})
                self.transport.ledger.record(party, SERVER, "control", 0, messages=0, method="lost")
            return r
        if policy == "retry" and self.retries < self.cfg.backend.max_retries and checkpoint.exists():
            self.retries += 1
            self.transport.revive(failure.parties)
            self.protocol.start()  # keys are never checkpointed: the revived parties' are new, agree them again
            self.resume()  # (the checkpoint's ledger and clock replace this exchange's traffic)
            return self.start_round
        self.write(self.summarize(wall) | {"finished": False})
        how = (f"continue with the same command and --out {self.out_dir} --resume" if checkpoint.exists()
               else "no checkpoint was written (set checkpoint_every to make runs resumable)")
        raise RunFailed(f"{failure} during round {r}; {how}")

    def interrupted(self, wall: float) -> None:
        """Keep what an interrupted run did: a checkpoint of its last completed round and a partial
        summary marked unfinished."""
        if self.completed >= self.start_round:
            self.save_checkpoint(self.completed, wall)
        self.write(self.summarize(wall) | {"finished": False})

    # ---- results ----------------------------------------------------------------------------------
    def summarize(self, wall: float) -> dict[str, Any]:
        cfg, ledger, rows = self.cfg, self.transport.ledger, self.metrics
        best = best_row(rows) or {}
        target = cfg.eval.target()
        hit = next((row for row in rows if target is not None and row[target[0]] >= target[1]), None)
        last_round = rows[-1]["round"] if rows else 0
        return {
            "protocol": cfg.protocol_name,
            "dataset": cfg.dataset.name.lower(),
            "backend": cfg.backend.name,
            "seed": cfg.seed,
            "rounds": last_round,
            "best_round": best.get("round"),
            "best_val_accuracy": best.get("val_accuracy"),
            "test_accuracy": best.get("test_accuracy"),
            "test_macro_f1": best.get("test_macro_f1"),
            "test_auc": best.get("test_auc"),
            "final_test_accuracy": rows[-1]["test_accuracy"] if rows else None,
            "final_test_macro_f1": rows[-1]["test_macro_f1"] if rows else None,
            "final_test_auc": rows[-1]["test_auc"] if rows else None,
            "final_train_loss": rows[-1].get("train_loss") if rows else None,
            "bytes_total": ledger.total(),
            "bytes_by_kind": ledger.by_kind(include_eval=False),
            "bytes_by_direction": ledger.by_direction(),
            "eval_bytes": ledger.total(kind="eval", include_eval=True),
            "sim_time_s": self.transport.clock.now,
            "wall_time_s": wall,
            "compute_s_by_party": {name: round(sec, 4) for name, sec in self.transport.compute_s.items()},
            # the wall covers rounds 1 to the last completed (on resume too), evaluated or not
            "wall_ms_per_round": 1e3 * wall / max(self.completed, last_round) if rows else None,
            "target_val_accuracy": cfg.eval.target_val_accuracy,
            **({"target_test_accuracy": cfg.eval.target_test_accuracy} if cfg.eval.target_test_accuracy else {}),
            "round_at_target": hit["round"] if hit else None,
            "bytes_at_target": hit["bytes_total"] if hit else None,
            "sim_time_at_target_s": hit["sim_time_s"] if hit else None,
            "network": cfg.network.model_dump(),
            "partition": getattr(self.protocol, "partition_stats", None) and self.protocol.partition_stats.summary(),
            **self.protocol.summary(),
            "lost_parties": self.lost,
            "retries": self.retries,
            "config_hash": config_hash(cfg),
            "finished": True,
        }

    def write(self, summary: dict[str, Any]) -> None:
        write_jsonl(self.out_dir / METRICS, self.metrics)
        write_jsonl(self.out_dir / LEDGER, self.transport.ledger.rows())
        write_json(self.out_dir / SUMMARY, {k: (None if isinstance(v, float) and math.isnan(v) else v)
                                             for k, v in summary.items()})
        plots = []
        # Drawing loads matplotlib (about a second): only when asked for, or for trackers to show.
        if self.metrics and ("curves" in self.cfg.logging or self.tracking.trackers):
            plot_curves({"": self.metrics}, self.out_dir / PLOT,
                        f"{summary['protocol']} on {summary['dataset']} (seed {summary['seed']})",
                        round_unit(self.cfg.protocol))
            plots.append(self.out_dir / PLOT)
        self.tracking.finish(summary, plots)

