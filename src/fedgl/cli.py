"""The ``fedgl`` command line: run, bench, datasets, report, audit, partition, keys.

Every user error (bad config, unknown dataset, impossible partition) is one line on stderr and exit
code 2; a traceback means a bug in fedgl.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import re
import sys
from pathlib import Path

from . import __version__
from .errors import ConfigError, FedglError, RunFailed, gpu_out_of_memory, out_of_memory
from .files import check_folder


@functools.cache
def console():
    """The terminal printer (rich is imported only when something is printed)."""
    from rich.console import Console

    return Console(soft_wrap=True)  # one result line, whatever the width

_FLAGS = {  # run flags that are shorthands for config keys
    "protocol": "protocol.name",
    "dataset": "dataset.name",
    "data_root": "dataset.data_root",
    "rounds": "train.rounds",
    "seed": "seed",
    "clients": "partition.num_clients",
    "backend": "backend.name",
}


def _switched_protocol(config: str | None, protocol: str | None, overrides: list[str]) -> list[str]:
    """``--protocol`` naming another protocol than the one the config names: the config's options that
    the new protocol also has are kept, the others (they belong to the config's protocol) are left out
    with a note, instead of being refused; ``--set protocol.KEY`` still applies."""
    from .config import read_yaml
    from .protocols import protocol_class

    section = (read_yaml(config).get("protocol") or {}) if config and protocol else {}
    if not isinstance(section, dict) or section.get("name") is None or str(section["name"]).lower() == protocol.lower():
        return []
    try:
        accepted = protocol_class(protocol).Options.model_fields
    except ConfigError:
        return []  # an unknown name: the config's validation names it
    kept = {key: value for key, value in section.items() if key != "name" and key in accepted}
    overrides[overrides.index(f"protocol.name={json.dumps(protocol, ensure_ascii=False)}")] = "protocol=" + json.dumps(
        {"name": protocol, **kept})
    left = [key for key in section if key != "name" and key not in accepted]
    return [f"{section['name']}'s protocol options in {config} that {protocol} does not have are left out: "
            f"{', '.join(left)}"] if left else []


def _paper_training_notes(cfg, config: str, sets: list[str]) -> list[str]:
    """``train`` values a config file sets (and ``--set`` does not) that differ from the paper values of
    the protocol ``--protocol`` switched to: the file's values win, which the switch may not have meant."""
    from .config import DEFAULT_PROTOCOL, read_yaml
    from .protocols import protocol_class

    data = read_yaml(config)
    section = data.get("protocol") if isinstance(data.get("protocol"), dict) else {}
    if str(section.get("name", DEFAULT_PROTOCOL)).lower() == cfg.protocol_name:
        return []  # no switch: the file's values were chosen for this protocol
    given = data.get("train") if isinstance(data.get("train"), dict) else {}
    set_here = {assignment.split("=", 1)[0] for assignment in sets}
    paper = protocol_class(cfg.protocol_name).paper_training(cfg.model.name, cfg.train.optimizer)
    differ = [key for key, value in paper.items() if key in given and getattr(cfg.train, key) != value
              and not set_here & {"train", f"train.{key}"}]
    if not differ:
        return []
    return [f"{cfg.protocol_name} trains with {', '.join(f'train.{k} = {getattr(cfg.train, k):g}' for k in differ)} "
            f"from {config}; its paper's {'values are' if len(differ) > 1 else 'value is'} "
            f"{', '.join(f'{paper[k]:g}' for k in differ)} (remove {'them' if len(differ) > 1 else 'it'} from "
            f"{config} or --set {' --set '.join(f'train.{k}={paper[k]:g}' for k in differ)})"]


def _flag_overrides(args: argparse.Namespace) -> list[str]:
    """The shorthand flags as ``--set`` assignments. A text flag is quoted, so it is taken as given (a path
    holding `` #`` or ``: ``, a date, ``yes``), never read as YAML. A ``--set`` giving the same key another
    value is refused: which of the two was meant cannot be told."""
    from .config import parse_override

    given = {key: (flag, value) for flag, key in _FLAGS.items() if (value := getattr(args, flag)) is not None}
    for assignment in args.set or []:
        key, value = parse_override(assignment)
        for flag_key, (flag, flag_value) in given.items():
            if not f"{flag_key}.".startswith(f"{key}."):
                continue
            other, option = _value_at(value, flag_key.removeprefix(key)), f"--{flag.replace('_', '-')}"
            if other is None and key != flag_key:  # a whole section, set after the flag, without it
                raise ConfigError(f"--set {assignment} replaces the whole {key} section, and with it {option} "
                                  f"{flag_value}; give {flag_key.removeprefix(key + '.')} inside it instead")
            names = flag in ("protocol", "dataset", "backend")  # names in any case
            if (str(other) != str(flag_value) if not names else str(other).lower() != flag_value.lower()):
                raise ConfigError(f"{option} {flag_value} and --set {assignment} disagree; give one of them")
    return [f"{key}={json.dumps(value, ensure_ascii=False) if isinstance(value, str) else value}"
            for key, (_, value) in given.items()]


def _value_at(value, path: str):
    """What ``value`` (a ``--set`` value) holds at the dotted ``path`` below it (``""``: itself), or None."""
    for part in filter(None, path.split(".")):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _run(args: argparse.Namespace) -> int:
    from .ray_start import start_in_background

    if args.backend == "ray" and not any(item.startswith("backend.address=") for item in args.set or []):
        start_in_background()  # a local Ray starts while the run imports torch and loads (ray_start.py)
    from .config import load_config
    from .progress import human_bytes
    from .config.candidates import label
    from .session import prepare, unread_settings

    overrides = _flag_overrides(args)
    notes = _switched_protocol(args.config, args.protocol, overrides)
    cfg = load_config(args.config, overrides + list(args.set or []))
    if cfg.backend.name == "ray" and not cfg.backend.address:  # or while the run loads its data
        start_in_background(cfg.backend.ray_auth)
    if args.config and args.protocol:
        notes += _paper_training_notes(cfg, args.config, list(args.set or []))
    for note in notes + unread_settings(cfg):
        print(f"fedgl: note: {note}", file=sys.stderr)
    if cfg.privacy.dp is not None and cfg.privacy.dp.warning():
        print(f"fedgl: warning: {cfg.privacy.dp.warning()}", file=sys.stderr)
    job = prepare(cfg, args.out, resume=args.resume, overwrite=args.overwrite)
    if args.resume:
        console().print(f"resuming from round {job.start_round}" if job.start_round <= cfg.train.rounds else
                        f"the checkpoint is at round {cfg.train.rounds}, the last: nothing left to train")
    try:
        result = job.execute(progress=not (args.quiet or args.json))
    except KeyboardInterrupt:
        if job.completed >= job.start_round:
            print(f"fedgl: interrupted after round {job.completed}; continue with the same command and "
                  f"--out {job.out_dir} --resume", file=sys.stderr)
        else:
            print("fedgl: interrupted before the first round ended; nothing to resume", file=sys.stderr)
        return 130
    s = result.summary
    if args.json:
        print(json.dumps(s | {"out_dir": str(result.out_dir)}, default=float))
        return 0
    console().print(
        f"[bold]{s['protocol']}[/bold] on {s['dataset']} ({s['backend']}, seed {s['seed']}): "
        f"{s['rounds']} rounds, best val {s['best_val_accuracy']:.4f} at round {s['best_round']}, "
        f"test {s['test_accuracy']:.4f}, {human_bytes(s['bytes_total'])} sent, "
        f"simulated {s['sim_time_s']:.2f} s, wall {s['wall_time_s']:.2f} s"
    )
    if s.get("chosen"):
        tried = ", ".join(f"{label(row['choice'])}: val {row['best_val_accuracy']:.4f}" for row in s["search"])
        console().print(f"chosen on validation: {label(s['chosen'])} ({tried}); the bytes and times are all "
                        f"{len(s['search'])} runs'")
    for split in ("val", "test"):
        if s.get(f"target_{split}_accuracy") is not None:
            reached = f"round {s['round_at_target']}" if s["round_at_target"] else "not reached"
            console().print(f"target {split} accuracy {s[f'target_{split}_accuracy']}: {reached}")
    console().print(f"results: {result.out_dir}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .bench import all_tasks, get_task, run_task

    if args.task is None or args.list:
        for name, task in sorted(all_tasks().items()):
            console().print(f"[bold]{name}[/bold]: {task.description}")
        return 0
    from .config import parse_override

    if args.seeds is not None and args.seeds < 1:
        raise ConfigError(f"--seeds must be at least 1 (got {args.seeds})")
    overrides = dict(parse_override(assignment) for assignment in args.set or [])
    task = get_task(args.task)
    out = Path(args.out) if args.out else Path("benchmarks") / "results" / task.name
    check_folder(out, "--out" if args.out else "", "" if args.out else "pass --out or move it")
    if args.extend and args.rerun:
        raise ConfigError("--extend keeps the runs results.json lists and --rerun runs everything again; choose one")
    if args.cluster and args.executor != "ray":
        raise ConfigError("--cluster names the Ray cluster of --executor ray; add --executor ray")
    run_task(task, out, seeds=args.seeds, quick=args.quick, backend=args.backend, overrides=overrides,
             only=args.only, rerun=args.rerun, extend=args.extend, console=console(), jobs=args.jobs,
             executor=args.executor, cluster=args.cluster, plan=args.plan)
    if not args.plan:
        console().print(f"results: {out}")
    return 0


def _datasets(args: argparse.Namespace) -> int:
    from rich.table import Table

    from .data import check_dataset, dataset_names, dataset_status, resolve_data_root

    root = resolve_data_root(args.data_root)
    console().print(f"data root: {root}")
    names = args.names or dataset_names()
    unknown = [n for n in names if n.lower() not in dataset_names()]
    if unknown:
        raise ConfigError(f"unknown dataset {', '.join(map(repr, unknown))}; allowed: {', '.join(dataset_names())}")
    table = Table()
    if args.action == "list":
        for column in ("dataset", "status", "source", "folder (under the data root)", "detail"):
            table.add_column(column)
        for name in names:
            st = dataset_status(name, args.data_root)
            folder = os.path.relpath(st.path, root) if st.path.startswith(root) else st.path
            table.add_row(st.name, "present" if st.present else "missing", st.source, folder, st.detail)
        console().print(table)
        return 0
    failed = 0
    for column in ("dataset", "nodes", "edges", "features", "classes", "train/val/test", "status"):
        table.add_column(column)
    for name in names:
        try:
            info = check_dataset(name, args.data_root)
        except FedglError as err:
            failed += 1
            table.add_row(name, "", "", "", "", "", f"[red]{err}[/red]")
            continue
        table.add_row(name, str(info["nodes"]), str(info["edges"]), str(info["features"]), str(info["classes"]),
                      f"{info['train']}/{info['val']}/{info['test']}", "[green]ok[/green]")
    console().print(table)
    return 2 if failed and args.names else 0  # a named dataset that does not load is bad input


def _report(args: argparse.Namespace) -> int:
    from .report import report

    report([Path(p) for p in args.folders], Path(args.out) if args.out else None, console(),
           Path(args.html) if args.html else None)
    return 0


def _partition(args: argparse.Namespace) -> int:
    from .config import load_config
    from .deployment import write_shards
    from .session import unread_settings

    cfg = load_config(args.config, list(args.set or []))
    for note in unread_settings(cfg):
        if note.startswith("partition."):
            print(f"fedgl: note: {note}", file=sys.stderr)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    manifest = write_shards(cfg, out)
    console().print(f"{len(manifest['parties'])} party shards, the server's state and the evaluator's ground truth "
                  f"written to {out}; run with --set backend.shards={out}")
    return 0


def _keys(args: argparse.Namespace) -> int:
    """``keys new``: an organisation's own identity key pair; ``keys roster``: a federation's roster
    from its members' public keys (client i is the i-th file)."""
    from .privacy.identity import Identity, Roster, read_public

    out = Path(args.out)
    if args.action == "new":
        if args.public:
            raise ConfigError(f"fedgl keys new takes no public keys (got {' '.join(args.public)}); only --out")
        path = Identity.generate().write(check_folder(out, "--out"))
        console().print(f"identity key written to {path} (keep it); its public key, {out / 'identity.pub'}, "
                        f"goes into the federation's roster")
        return 0
    keys = tuple(read_public(p) for p in args.public)
    if len(set(keys)) != len(keys) or not keys:
        raise ConfigError("fedgl keys roster needs one distinct public key per client, client 0 first")
    try:
        Roster(keys).write(out)
    except ConfigError as err:  # a folder, a missing folder or a file in the way: the option names it
        raise ConfigError(f"--out {err}") from None
    console().print(f"roster of {len(keys)} clients written to {out}; name it in the config: "
                    f"privacy: {{secure_aggregation: {{roster: {out}}}}}")
    return 0


def _audit(args: argparse.Namespace) -> int:
    from .audit import audit_command

    return audit_command(Path(args.run_dir), console(), as_json=args.json, data_root=args.data_root)


def _bench_parser(sub) -> None:
    """``fedgl bench``: which runs of a task, and where they go (``--jobs``, ``--executor``, ``--cluster``)
    apart from where each run's parties live (``--backend``)."""
    b = sub.add_parser("bench", help="run a named benchmark task (no name: list them)")
    b.add_argument("task", nargs="?")
    b.add_argument("--list", action="store_true")
    b.add_argument("--seeds", type=int, help="seeds per variant (default: the task's)")
    b.add_argument("--quick", action="store_true", help="short smoke version of the task, one seed")
    b.add_argument("--backend", choices=["local", "ray"],
                   help="where each run's parties live (backend.name): in the run's process, or on Ray actors")
    b.add_argument("--jobs", type=int, metavar="N", help="runs at once, each in its own process (default: one "
                   "after another here; with --executor ray: as many as the cluster takes)")
    b.add_argument("--executor", choices=["processes", "ray"], help="where the runs go: worker processes on "
                   "this machine (the default with --jobs) or Ray tasks of one CPU each, whose run folders "
                   "come back here")
    b.add_argument("--cluster", metavar="ADDRESS", help="the Ray cluster of --executor ray (default: a new "
                   "local Ray on loopback)")
    b.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key in every run "
                   "(not seed: a task's runs take seeds 0 to --seeds - 1, and --set seed=N is refused)")
    b.add_argument("--out", help="results folder (default benchmarks/results/<task>)")
    b.add_argument("--only", action="append", metavar="LABEL",
                   help="run only the variants whose label contains LABEL (repeatable)")
    b.add_argument("--rerun", action="store_true",
                   help="run again even where the folder holds a finished run with the same config")
    b.add_argument("--extend", action="store_true",
                   help="keep the runs the folder's results.json lists (a committed table, without run folders) "
                   "where they computed what the task asks, and run only the others, e.g. more seeds")
    b.add_argument("--plan", action="store_true",
                   help="run nothing: list the runs the other options would make, each with its wall time "
                   "estimated from the runs in results.json that computed the same for as long, and the total "
                   "over --jobs")
    b.set_defaults(func=_bench)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedgl", description="Federated graph learning with measured communication.")
    p.add_argument("--version", action="version", version=f"fedgl {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="train one federation from a YAML config (default: a synthetic demo)")
    r.add_argument("config", nargs="?", help="YAML config; omitted = the embedded synthetic default")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key, e.g. train.rounds=50")
    r.add_argument("--out", help="results folder (default results/<protocol>-<dataset>-seed<seed>-<time>)")
    r.add_argument("--backend", choices=["local", "ray", "flower"])
    r.add_argument("--protocol")
    r.add_argument("--dataset")
    r.add_argument("--data-root", dest="data_root")
    r.add_argument("--rounds", type=int)
    r.add_argument("--seed", type=int)
    r.add_argument("--clients", type=int)
    r.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    r.add_argument("--overwrite", action="store_true", help="replace a finished run in --out")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    r.add_argument("--json", action="store_true", help="print only the summary, as one JSON line")
    r.set_defaults(func=_run)

    _bench_parser(sub)

    d = sub.add_parser("datasets", help="list datasets and their status, or load them to check")
    d.add_argument("action", choices=["list", "check"])
    d.add_argument("names", nargs="*")
    d.add_argument("--data-root", dest="data_root")
    d.set_defaults(func=_datasets)

    rep = sub.add_parser("report", help="a table and plots over result folders")
    rep.add_argument("folders", nargs="+")
    rep.add_argument("--out", help="folder for report.md, curves.png and report.html (default: print only)")
    rep.add_argument("--html", metavar="PATH", help="write the HTML report page (table and plots) to PATH")
    rep.set_defaults(func=_report)

    part = sub.add_parser("partition", help="write one shard file per party and a manifest, for deployment")
    part.add_argument("config", nargs="?", help="the run's YAML config")
    part.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key")
    part.add_argument("--out", required=True, help="the shard folder")
    part.set_defaults(func=_partition)

    k = sub.add_parser("keys", help="secure aggregation identities: a key pair of your own, a federation's roster")
    k.add_argument("action", choices=["new", "roster"])
    k.add_argument("public", nargs="*", help="roster: each client's identity.pub, client 0 first")
    k.add_argument("--out", required=True, help="new: the folder of identity.key and identity.pub (beside your "
                   "party's shard: <shards>/<party>/); roster: the roster file")
    k.set_defaults(func=_keys)

    a = sub.add_parser("audit", help="attack the messages a run recorded (privacy.record_messages: true)")
    a.add_argument("run_dir")
    a.add_argument("--data-root", dest="data_root", help="where the auditor reads the ground truth")
    a.add_argument("--json", action="store_true", help="print the report as one JSON line")
    a.set_defaults(func=_audit)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except FedglError as err:
        print(f"fedgl: error: {err}", file=sys.stderr)
        return 2
    except RunFailed as err:
        print(f"fedgl: {args.command} failed: {err}", file=sys.stderr)
        return 1
    except (MemoryError, RuntimeError) as err:
        if not out_of_memory(err):
            raise
        where = " on the GPU" if gpu_out_of_memory(err) else ""
        print(f"fedgl: {args.command} failed: out of memory{where}{_wanted(str(err))}; a smaller model, batch or "
              f"graph needs less", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fedgl: interrupted", file=sys.stderr)
        return 130


def _wanted(message: str) -> str:
    """The size of the allocation that failed, as torch's CPU ("tried to allocate 123 bytes") and GPU
    ("Tried to allocate 2.00 GiB") allocators name it."""
    found = re.search(r"tried to allocate ([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)", message, re.IGNORECASE)
    if not found:
        return ""
    from .progress import human_bytes

    unit = {"bytes": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}[found.group(2).lower()]
    return f" ({human_bytes(float(found.group(1)) * unit)} at once)"


def command() -> None:
    """The ``fedgl`` command: ``main``, then exit. The objects left are frozen out of the interpreter's
    final garbage collection, which would walk everything torch and the run made (about 0.6 s) only to
    free memory the process is about to give back."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    command()
