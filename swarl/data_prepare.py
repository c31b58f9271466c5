"""`swarl data prepare`: rows of a SWE dataset (any family swe.adapters knows) → prepared JSONL.

Input (`--source`): a Hugging Face dataset id (loaded with `datasets` when the hub answers), a
dataset family's name (`swe-bench`, `swe-gym`, `swe-smith`, `r2e-gym`: its first listed hub
dataset), a local JSON / JSONL / parquet file (plain rows, or rows already prepared), or
`swarl-tasks` (the bundled task suite; splits all, train, heldout).

The family (`--family`) decides how a row is checked, named and later graded: given, or the one
whose adapter lists the dataset id exactly, else each row's own `dataset_family` or shape (see
swe.adapters.base); a row that fits no family, or several, is an error naming the field.
Output directory:
  <split>.jsonl        {"text": problem_statement, "metadata": {"instance": row, "data_source": ...}}
  eval.jsonl           the same records plus metadata.image, for `swarl eval --data`
  instance_ids.txt     one id a line
  docker_images.txt    one image a line (deduplicated), for pre-pulling on Docker nodes
  errors.jsonl         rows skipped with --on-error skip (where, instance_id, field, error)
  prepare.json         counts and the arguments of this run
Every row is checked by `swe.rows.validate_row` (its family's adapter: an error names the row —
file line or index, and instance_id — and the field) and written with its Docker image in
`image_name` and its family in `dataset_family`. With --on-error fail (the default) one bad row
means nothing is written.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.files import atomic_write_text
from common.logs import get_logger
from swe.adapters import adapters, family_of_source, get_adapter
from swe.rows import RowError, SourceRow, jsonl_rows, source_row, validate_row

log = get_logger("data")

LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet")
BUNDLED = "swarl-tasks"  # the bundled task suite (swe/tasks): splits all, train, heldout
HUB_PROBE_TIMEOUT_S = 3.0


class DataError(ValueError):
    """A data problem; the message names the source, the row and the field."""


@dataclass
class PrepareResult:
    out_dir: str
    source: str
    data_source: str
    split: str
    family: str | None = None
    rows_read: int = 0
    rows_written: int = 0
    filtered_out: int = 0
    errors: int = 0
    repos: dict[str, int] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- sources ---------------------------------------------------------------------------

def hub_datasets() -> dict[str, str]:
    """The hub datasets the adapters list, with their usual split."""
    return {name: split for a in adapters().values() for name, split in a.hub_datasets.items()}


def is_local(source: str) -> bool:
    return Path(source).exists() or source.endswith(LOCAL_SUFFIXES)


def resolve_source(source: str, family: str | None) -> tuple[str, str | None]:
    """(the source to read, the family its rows are read as). A family's name as the source
    reads its first listed hub dataset (the bundled suite for swarl's own)."""
    if family is not None:
        try:
            family = get_adapter(family).family
        except RowError as e:
            raise DataError(f"--family: {e.msg}") from None
    named = family_of_source(source)
    if source == BUNDLED or Path(source).is_file() or (named is None and is_local(source)):
        return source, family or ("swarl" if source == BUNDLED else None)
    if named is not None and source not in hub_datasets():  # a family's name, not a dataset id
        if family is not None and family != named:
            raise DataError(f"--source {source!r} is the {named} family, but --family says {family}")
        hub = list(get_adapter(named).hub_datasets)
        if named == "swarl" or not hub:
            return BUNDLED, named
        return hub[0], named
    if named is not None and family is not None and family != named:
        raise DataError(f"--source {source!r} is a {named} dataset, but --family says {family}")
    return source, family or named


def default_split(source: str) -> str:
    if source == BUNDLED:
        return "all"
    if is_local(source):
        return "train"
    return hub_datasets().get(source, "train")


def read_source(source: str, split: str) -> Iterator[SourceRow | RowError]:
    if source == BUNDLED:
        yield from _read_bundled(split)
    elif is_local(source):
        yield from _read_local(Path(source))
    else:
        yield from _read_hub(source, split)


def _read_bundled(split: str) -> Iterator[SourceRow]:
    from swe.tasks import SPLITS, load_tasks

    if split not in SPLITS:
        raise DataError(f"--split: {BUNDLED} has splits {', '.join(SPLITS)}, got {split!r}")
    for i, row in enumerate(load_tasks(split)):
        yield SourceRow(f"{BUNDLED}[{split}] row {i}", row, None)


def _read_local(path: Path) -> Iterator[SourceRow | RowError]:
    if not path.exists():
        raise DataError(f"{path}: no such file")
    name = path.name
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # datasets depends on pyarrow

        try:
            table = pq.read_table(path)
        except Exception as e:
            raise DataError(f"{path}: not a readable parquet file: {e}") from None
        for i, row in enumerate(table.to_pylist()):
            yield _source_row(f"{name} row {i}", row)
        return
    if path.suffix == ".json":
        text = path.read_text(encoding="utf-8")
        if text.lstrip().startswith("["):
            try:
                rows = json.loads(text)
            except json.JSONDecodeError as e:
                raise DataError(f"{name}: not valid JSON at line {e.lineno}: {e.msg}") from None
            for i, row in enumerate(rows):
                yield _source_row(f"{name} row {i}", row)
            return
    yield from jsonl_rows(path)  # JSON Lines (also a .json file holding one object per line)


def _source_row(where: str, record: Any) -> SourceRow | RowError:
    """A raw row or a prepared record (re-filtering a prepared file)."""
    try:
        return source_row(where, record)
    except RowError as e:
        return e


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    import httpx

    try:
        httpx.head(hub_endpoint(), timeout=timeout, follow_redirects=False)
        return True
    except httpx.HTTPError:
        return False


def _read_hub(name: str, split: str) -> Iterator[SourceRow]:
    # datasets retries for minutes against an unreachable hub: probe first (bounded), and
    # without the hub fall back to the local cache only (offline mode).
    offline = hub_offline()
    if not offline and not hub_reachable():
        offline = True
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
        log.warning("hub_unreachable_using_cache", endpoint=hub_endpoint(), dataset=name)
    import datasets

    if offline:
        datasets.config.HF_HUB_OFFLINE = True
        datasets.config.HF_DATASETS_OFFLINE = True
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:
        if offline:
            raise DataError(
                f"{name}: the Hugging Face hub ({hub_endpoint()}) is offline (HF_HUB_OFFLINE) or not reachable, and split "
                f"{split!r} is not in the local datasets cache ({type(e).__name__}). Prepare it on "
                f"a machine with hub access, or pass a local .json/.jsonl/.parquet file as --source"
            ) from None
        raise DataError(f"{name}[{split}]: could not load from the hub: {e}") from None
    for i, row in enumerate(ds):
        yield SourceRow(f"{name}[{split}] row {i}", dict(row), None)


# -- prepare ---------------------------------------------------------------------------

def repo_matches(repo: str, wanted: Iterable[str]) -> bool:
    """`--repo django/django` or `--repo django` (the name part), case-insensitive."""
    repo = repo.lower()
    for w in wanted:
        w = w.lower().strip()
        if repo == w or repo.split("/", 1)[-1] == w:
            return True
    return False


def record(row: dict[str, Any], data_source: str) -> dict[str, Any]:
    """The prepared training record."""
    return {"text": row["problem_statement"],
            "metadata": {"instance": row, "data_source": data_source}}


def prepare(
    source: str,
    out_dir: str | os.PathLike[str],
    split: str | None = None,
    max_samples: int | None = None,
    repos: Iterable[str] = (),
    on_error: str = "fail",
    data_source: str | None = None,
    family: str | None = None,
) -> PrepareResult:
    """Read, validate, filter and write. With on_error=fail nothing is written if any row
    is bad, and the error lists every bad row (up to 20). `family` reads every row as that
    dataset family (see resolve_source for what `source` may name)."""
    source, family = resolve_source(source, family)
    if on_error not in ("fail", "skip"):
        raise DataError(f"--on-error: expected fail or skip, got {on_error!r}")
    if max_samples is not None and max_samples < 1:
        raise DataError(f"--max-samples: must be >= 1, got {max_samples}")
    split = split or default_split(source)
    wanted = [r for r in repos if r.strip()]
    default_ds = data_source or (Path(source).stem if is_local(source) else source)
    res = PrepareResult(out_dir=str(out_dir), source=source, data_source=default_ds, split=split,
                        family=family)

    kept: list[tuple[dict[str, Any], str]] = []
    errors: list[RowError] = []
    seen: dict[str, str] = {}
    for src in read_source(source, split):
        if max_samples is not None and len(kept) >= max_samples:
            break
        res.rows_read += 1
        try:
            if isinstance(src, RowError):
                raise src
            ds = data_source or src.data_source or default_ds
            row = validate_row(src.row, ds, family=family, where=src.where)
            iid = row["instance_id"]
            if iid in seen:
                raise RowError(f"duplicate of {seen[iid]}", field="instance_id", where=src.where,
                               instance_id=iid)
            seen[iid] = src.where
        except RowError as e:
            errors.append(e)
            continue
        if wanted and not repo_matches(row["repo"], wanted):
            res.filtered_out += 1
            continue
        kept.append((row, ds))

    res.errors = len(errors)
    if errors and on_error == "fail":
        shown = "\n  ".join(str(e) for e in errors[:20])
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise DataError(f"{len(errors)} invalid row(s) in {source} (nothing written; "
                        f"--on-error skip writes the valid ones):\n  {shown}{more}")
    if not kept:
        raise DataError(f"{source}: no rows left to write (read {res.rows_read}, "
                        f"filtered out {res.filtered_out}, invalid {len(errors)})")
    for bad in errors:
        log.warning("row_skipped", where=bad.where, instance_id=bad.instance_id, field=bad.field,
                    error=bad.msg)
    _write_outputs(Path(out_dir), split, kept, errors, res)
    return res


def _write_outputs(out: Path, split: str, kept: list[tuple[dict[str, Any], str]],
                   errors: list[RowError], res: PrepareResult) -> None:
    out.mkdir(parents=True, exist_ok=True)
    images: dict[str, None] = {}
    train_lines, eval_lines, ids = [], [], []
    for row, ds in kept:
        rec = record(row, ds)
        image = row["image_name"]
        images.setdefault(image, None)
        train_lines.append(json.dumps(rec, ensure_ascii=False))
        ev = {"text": rec["text"], "metadata": {**rec["metadata"], "image": image}}
        eval_lines.append(json.dumps(ev, ensure_ascii=False))
        ids.append(row["instance_id"])
        res.repos[row["repo"]] = res.repos.get(row["repo"], 0) + 1
    res.rows_written = len(kept)
    files = {
        f"{re.sub(r'[^A-Za-z0-9_.-]', '_', split)}.jsonl": train_lines,  # "train[:100]" is a valid split
        "eval.jsonl": eval_lines,
        "instance_ids.txt": ids,
        "docker_images.txt": list(images),
    }
    if errors:
        files["errors.jsonl"] = [json.dumps(bad.as_dict(), ensure_ascii=False) for bad in errors]
    else:
        (out / "errors.jsonl").unlink(missing_ok=True)  # not a previous run's
    for name, lines in files.items():
        atomic_write_text(out / name, "".join(line + "\n" for line in lines))
        res.files[name] = str(out / name)
    res.files["prepare.json"] = str(out / "prepare.json")
    atomic_write_text(out / "prepare.json", json.dumps(res.as_dict(), indent=2, ensure_ascii=False) + "\n")
