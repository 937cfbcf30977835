"""Tables for ``kvplan models``, ``kvplan models show`` and ``kvplan gpus``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvplan import memory
from kvplan.planning.serialize import formula_lines, group_rows
from kvplan.units import GiB, parse_dtype, plural

if TYPE_CHECKING:
    from kvplan.gpus import Gpu
    from kvplan.model.spec import ModelSpec
    from kvplan.units import DType


def models_rows() -> list[dict[str, Any]]:
    """One row per bundled spec: id, kind, layers, bf16 bytes/token, parameters."""
    from kvplan.errors import KvplanError
    from kvplan.model.sources import bundled_ids, load_bundled
    from kvplan.model.spec import build_spec

    rows: list[dict[str, Any]] = []
    for model_id in bundled_ids():
        try:
            spec = build_spec(load_bundled(model_id))
        except KvplanError as exc:  # one broken spec must not hide the others
            rows.append({"id": model_id, "kind": "error", "layers": None, "kv_bytes_per_token": None, "dtype": None,
                         "parameters": None, "error": exc.one_line()})
            continue
        rows.append({
            "id": spec.model_id,
            "kind": spec.kind_summary,
            "layers": spec.num_layers,
            "kv_bytes_per_token": memory.kv_bytes_per_token(spec, _run_dtype(spec)),
            "dtype": spec.dtype,
            "parameters": spec.parameters,
        })
    return rows


def _run_dtype(spec: "ModelSpec") -> "DType":
    """The dtype vLLM runs the checkpoint in on a GPU with bfloat16 (a float32 checkpoint: bfloat16)."""
    from kvplan.engines.vllm import auto_dtype

    return parse_dtype(auto_dtype(spec.dtype, spec.model_type, bf16=True))


def render_models(rows: list[dict[str, Any]], width: int | None = None) -> Any:
    """The bundled specs; ids are never cut (they are what people copy): at a narrow ``width`` (default:
    the terminal's) the kind wraps and the parameter and layer columns are dropped, and said so."""
    from kvplan.render.fit import COMPACT, Col, fitted_table, terminal_width

    cols = [Col("model"), Col("kind", wrap=True), Col("layers", justify="right", drop=2),
            Col("KV B/token", justify="right", drop=3), Col("params", justify="right", drop=1)]
    for r in rows:
        if r.get("error"):
            cells: list[Any] = [r["id"], Text("error", style="red"), "", "", ""]
        else:
            params = f"{r['parameters'] / 1e9:,.1f}B" if r["parameters"] else "?"
            cells = [r["id"], r["kind"], str(r["layers"]), f"{r['kv_bytes_per_token']:,}", params]
        for col, cell in zip(cols, cells):
            col.cells.append(cell)
    table, dropped = fitted_table(cols, width or terminal_width(), title=f"{len(rows)} bundled model specs",
                                  title_justify="left", **COMPACT)
    if not dropped:
        return table
    return Group(table, Text(f"({', '.join(dropped)} not shown at this width: see --json)", style="grey62"))


def model_detail(spec: "ModelSpec", source: str, kv_dtype_name: str | None = None) -> dict[str, Any]:
    """The resolved spec: provenance and a per-group breakdown (bytes in the KV dtype)."""
    model_dtype = _run_dtype(spec)
    kv_dtype = parse_dtype(kv_dtype_name) if kv_dtype_name and kv_dtype_name != "auto" else model_dtype
    return {
        "id": spec.model_id,
        "source": source,
        "architecture": spec.architecture,
        "kind": spec.kind_summary,
        "dtype": spec.dtype,
        "kv_dtype": kv_dtype.name,
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_attention_heads,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "parameters": spec.parameters,
        "weights_bytes": spec.weights.total_bytes if spec.weights else None,
        "weights_source": spec.weights.source if spec.weights else None,
        "num_experts": spec.num_experts,
        "groups": group_rows(spec.layers, kv_dtype, model_dtype),
        "kv_bytes_per_token": memory.kv_bytes_per_token(spec, kv_dtype),
        "state_bytes_per_request": memory.state_bytes_per_request(spec, model_dtype),
        "formula": formula_lines(spec.layers, kv_dtype, model_dtype),
        "provenance": dict(spec.provenance),
        "notes": list(spec.notes),
    }


def render_model_detail(d: dict[str, Any]) -> Group:
    head = Text.assemble((d["id"], "bold"), f"  {d['kind']} · {d['architecture']} · {plural(d['num_layers'], 'layer')} · {d['dtype']}\n",
                         (f"source: {d['source']}\n", "grey62"))
    if d["parameters"]:
        head.append(f"parameters: {d['parameters']:,}")
        if d["weights_bytes"]:
            head.append(f" · weights {d['weights_bytes'] / GiB:.2f} GiB ({d['weights_source']})")
        head.append("\n")
    table = Table(title=f"layer groups (KV {d['kv_dtype']})", title_justify="left")
    for col in ("kind", "layers", "kv heads", "head dim", "window", "B/token", "state B/request"):
        table.add_column(col, justify="left" if col == "kind" else "right")
    for g in d["groups"]:
        table.add_row(g["kind"], str(g["layers"]), str(g["kv_heads"]), str(g["head_dim"]),
                      f"{g['window_tokens']:,}" if g["window_tokens"] else "-", f"{g['bytes_per_token']:,}",
                      f"{g['state_bytes_per_request']:,}")
    formula = Text("\n".join(d["formula"]) + f"\ntotal: {d['kv_bytes_per_token']:,} B/token")
    prov = Text("provenance: " + "; ".join(f"{k} <- {v}" for k, v in d["provenance"].items()), style="grey62")
    parts = [head, table, formula, prov]
    parts += [Text(f"note: {n}", style="yellow") for n in d["notes"]]
    return Group(*parts)


def render_gpus(catalogue: "tuple[Gpu, ...]", width: int | None = None) -> Any:
    """The catalogue; names, numbers and aliases are never cut: the alias list wraps between aliases only
    ("H200 SXM 141GB" stays on one line)."""
    from kvplan.render.fit import COMPACT, Col, fitted_table, terminal_width

    cols = [Col("name"), Col("memory", justify="right"), Col("bandwidth", justify="right", drop=1),
            Col("aliases", wrap=True, drop=2)]
    for g in catalogue:
        mem = f"{g.memory_bytes / GiB:,.2f} GiB" if g.memory_bytes else "--gpu-memory"
        bw = f"{g.bandwidth_bytes_per_s / 1e12:,.2f} TB/s" if g.bandwidth_bytes_per_s else "-"
        for col, cell in zip(cols, (g.name, mem, bw, tuple(g.aliases[:4]))):
            col.cells.append(cell)
    table, dropped = fitted_table(cols, width or terminal_width(), **COMPACT,
                                  title=f"{plural(len(catalogue), 'GPU')} (memory as the CUDA/HIP runtime reports it)",
                                  title_justify="left")
    if not dropped:
        return table
    return Group(table, Text(f"({', '.join(dropped)} not shown at this width: see --json)", style="grey62"))
