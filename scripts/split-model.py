#!/usr/bin/env python3
"""Split an ONNX model into two parts at one named tensor (e.g. backbone and head).

Usage:
    python3 scripts/split-model.py MODEL.onnx TENSOR OUT_DIR
    python3 scripts/split-model.py --list MODEL.onnx

The first form writes
    OUT_DIR/<stem>.part1.onnx   graph inputs -> TENSOR
    OUT_DIR/<stem>.part2.onnx   TENSOR -> graph outputs (its only input is named TENSOR)
and prints both files with their inputs' and outputs' names and shapes. Running part 1 and
feeding its output to part 2 gives the whole model's outputs. Each part keeps only the
initializers its nodes use, and the batch dimension stays dynamic.

TENSOR must be a single-tensor cut: every path from the graph inputs to the graph outputs goes
through it (in a residual network, a block's output, not a tensor inside a block). `--list`
prints every node output with its op, element type and shape (where shape inference knows
them), marking with `cut` those that are single-tensor cuts.

Needs the `onnx` Python package; scripts/split-model.sh runs this script with the copy that
scripts/setup.sh installs. Exit status 2 for bad arguments, an unknown tensor or one that is
not a cut.
"""

import argparse
import difflib
import os
import sys

try:
    import onnx
    from onnx import shape_inference
    from onnx.utils import Extractor
except ImportError:
    sys.exit(
        "split-model: the `onnx` Python package is missing: run scripts/setup.sh and use "
        "scripts/split-model.sh (or `python3 -m pip install onnx`)"
    )


def fail(message):
    """Exits with status 2 (a usage error, as argparse does)."""
    print(f"split-model: {message}", file=sys.stderr)
    sys.exit(2)


def dims(value_info):
    """The shape of a ValueInfoProto as a list of ints / names / '?', or None when unknown."""
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    out = []
    for d in tensor_type.shape.dim:
        if d.HasField("dim_value"):
            out.append(d.dim_value)
        elif d.HasField("dim_param"):
            out.append(d.dim_param)
        else:
            out.append("?")
    return out


def describe(value_info):
    """`f32[batch,3,224,224]`-style type and shape."""
    if value_info is None:
        return "?"
    elem = value_info.type.tensor_type.elem_type
    name = onnx.helper.tensor_dtype_to_np_dtype(elem).name if elem else "?"
    shape = dims(value_info)
    return name + ("[?]" if shape is None else "[" + ",".join(str(d) for d in shape) + "]")


def subgraph_inputs(node):
    """Outer-scope names read by a node's subgraphs (If / Loop / Scan bodies)."""
    names = set()
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            graphs = [attr.g]
        elif attr.type == onnx.AttributeProto.GRAPHS:
            graphs = list(attr.graphs)
        else:
            continue
        for g in graphs:
            local = {i.name for i in g.input} | {i.name for i in g.initializer}
            for n in g.node:
                local.update(n.output)
            for n in g.node:
                names.update(i for i in n.input if i and i not in local)
                names.update(i for i in subgraph_inputs(n) if i not in local)
    return names


def node_inputs(node):
    return [i for i in node.input if i] + sorted(subgraph_inputs(node))


class Graph:
    """The model after shape inference, with what the cut analysis needs."""

    def __init__(self, path):
        try:
            model = onnx.load(path)
        except Exception as e:  # noqa: BLE001 (any load failure is the user's file)
            fail(f"cannot read {path}: {e}")
        try:
            model = shape_inference.infer_shapes(model)
        except Exception as e:  # noqa: BLE001
            print(f"split-model: warning: shape inference failed ({e})", file=sys.stderr)
        self.model = model
        g = model.graph
        self.initializers = {t.name for t in g.initializer}
        # Old IR versions list initializers among the inputs too.
        self.inputs = [i.name for i in g.input if i.name not in self.initializers]
        self.outputs = [o.name for o in g.output]
        self.value_infos = {v.name: v for v in list(g.value_info) + list(g.input) + list(g.output)}
        self.nodes = list(g.node)
        self.producer = {o: n for n in self.nodes for o in n.output if o}

        # Tensors that depend on a graph input (the rest are constants).
        self.dynamic = set(self.inputs)
        for n in self.nodes:  # ONNX requires topological order
            if any(i in self.dynamic for i in node_inputs(n)):
                self.dynamic.update(o for o in n.output if o)
        # Tensors the graph outputs depend on (the rest is dead code).
        self.useful = set()
        stack = list(self.outputs)
        while stack:
            t = stack.pop()
            if t in self.useful:
                continue
            self.useful.add(t)
            if t in self.producer:
                stack.extend(node_inputs(self.producer[t]))
        self.cuts = self._single_tensor_cuts()

    def _single_tensor_cuts(self):
        """Tensors through which every input-to-output path goes.

        Sweeps the nodes in order keeping the live tensors (dynamic, useful, still to be read);
        the output of node i is a cut when it is the only live tensor right after node i.
        """
        end = len(self.nodes)
        last_use = {}
        for i, n in enumerate(self.nodes):
            for t in node_inputs(n):
                last_use[t] = i
        for t in self.outputs:
            last_use[t] = end
        relevant = self.dynamic & self.useful
        live = {t for t in self.inputs if t in relevant and last_use.get(t, -1) >= 0}
        cuts = set()
        for i, n in enumerate(self.nodes):
            live.update(o for o in n.output if o in relevant and last_use.get(o, -1) > i)
            live = {t for t in live if last_use.get(t, -1) > i}
            for o in n.output:
                if live == {o} and o not in self.outputs:
                    cuts.add(o)
        return cuts


def list_tensors(graph, path):
    print(f"# tensors of {path}: `cut` marks a valid TENSOR (every input-to-output path")
    print("# goes through it); each line: [cut] name  (op, type[shape])")
    for name in graph.inputs:
        print(f"     {name}  (graph input, {describe(graph.value_infos.get(name))})")
    for n in graph.nodes:
        if n.op_type == "Constant":
            continue
        for o in n.output:
            if not o:
                continue
            mark = "cut" if o in graph.cuts else "   "
            print(f"{mark}  {o}  ({n.op_type}, {describe(graph.value_infos.get(o))})")


def keep_batch_dynamic(graph, value_info):
    """When the model's first input has a dynamic batch dimension and shape inference fixed
    `value_info`'s first dimension, makes it dynamic again (same name)."""
    first = graph.value_infos.get(graph.inputs[0]) if graph.inputs else None
    shape = dims(first) if first is not None else None
    if not shape or isinstance(shape[0], int):
        return
    batch = value_info.type.tensor_type.shape.dim[0] if dims(value_info) else None
    if batch is not None and batch.HasField("dim_value"):
        batch.dim_param = shape[0] if shape[0] != "?" else "batch"


def clean_value_info(part):
    """Drops value_info entries that duplicate the part's own inputs and outputs."""
    io = {v.name for v in list(part.graph.input) + list(part.graph.output)}
    kept = [v for v in part.graph.value_info if v.name not in io]
    del part.graph.value_info[:]
    part.graph.value_info.extend(kept)


def check_self_contained(part, allowed, which):
    """Every tensor a part reads is its input, an initializer or made inside it."""
    known = set(allowed) | {t.name for t in part.graph.initializer}
    for n in part.graph.node:
        missing = [i for i in node_inputs(n) if i not in known]
        if missing:
            fail(f"{which} would need {missing} besides its inputs (internal error)")
        known.update(n.output)


def split(graph, path, tensor, out_dir):
    if tensor in graph.inputs or tensor in graph.outputs:
        fail(f"`{tensor}` is a graph input or output: cut at a tensor inside the graph")
    if tensor not in graph.producer:
        close = difflib.get_close_matches(tensor, list(graph.producer), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        fail(f"no tensor `{tensor}` in {path}{hint}; `--list` prints the tensor names")
    if tensor not in graph.cuts:
        fail(
            f"`{tensor}` is not a single-tensor cut of {path}: some path from the inputs to "
            "the outputs goes around it (e.g. a residual connection); `--list` marks the "
            "tensors that are"
        )
    if tensor not in graph.value_infos:
        fail(f"shape inference gives no type for `{tensor}`, so it cannot be a part's input")
    keep_batch_dynamic(graph, graph.value_infos[tensor])

    extractor = Extractor(graph.model)
    part1 = extractor.extract_model(graph.inputs, [tensor])
    # Part 1's inputs: only the graph inputs it reads (all of them, as `tensor` is a cut).
    read = {i for n in part1.graph.node for i in node_inputs(n)}
    unused = [i for i in part1.graph.input if i.name not in read]
    for i in unused:
        part1.graph.input.remove(i)
    part2 = extractor.extract_model([tensor], graph.outputs)
    for part, allowed, which in [
        (part1, graph.inputs, "part 1"),
        (part2, [tensor], "part 2"),
    ]:
        clean_value_info(part)
        check_self_contained(part, allowed, which)
        part.producer_name = "riffle split-model.py"
        part.doc_string = f"{which} of {os.path.basename(path)}, split at {tensor}"
        try:
            onnx.checker.check_model(part)
        except onnx.checker.ValidationError as e:
            fail(f"{which} does not pass the ONNX checker: {e}")

    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.basename(path)
    if stem.endswith(".onnx"):
        stem = stem[: -len(".onnx")]
    for k, part in [(1, part1), (2, part2)]:
        dest = os.path.join(out_dir, f"{stem}.part{k}.onnx")
        tmp = dest + ".tmp"
        if part.ByteSize() > onnx.checker.MAXIMUM_PROTOBUF:
            data = os.path.basename(dest) + ".data"
            onnx.save(part, tmp, save_as_external_data=True, location=data)
        else:
            onnx.save(part, tmp)
        os.replace(tmp, dest)
        ins = ", ".join(f"{i.name} {describe(i)}" for i in part.graph.input)
        outs = ", ".join(f"{o.name} {describe(o)}" for o in part.graph.output)
        print(f"{dest}: {len(part.graph.node)} nodes, {len(part.graph.initializer)} initializers")
        print(f"  inputs:  {ins}")
        print(f"  outputs: {outs}")


def main():
    parser = argparse.ArgumentParser(
        description="Split an ONNX model into two parts at a named tensor.",
        epilog="`--list MODEL.onnx` prints the tensors to choose from.",
    )
    parser.add_argument("model", metavar="MODEL.onnx")
    parser.add_argument("tensor", metavar="TENSOR", nargs="?")
    parser.add_argument("out_dir", metavar="OUT_DIR", nargs="?")
    parser.add_argument(
        "--list", action="store_true", help="print candidate tensor names and shapes"
    )
    args = parser.parse_args()
    if not os.path.isfile(args.model):
        fail(f"no model file {args.model}")
    if args.list:
        if args.tensor or args.out_dir:
            parser.error("--list takes only MODEL.onnx")
        list_tensors(Graph(args.model), args.model)
        return
    if not args.tensor or not args.out_dir:
        parser.error("give MODEL.onnx TENSOR OUT_DIR (or --list MODEL.onnx)")
    split(Graph(args.model), args.model, args.tensor, args.out_dir)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # `--list | head`
        sys.stderr.close()
        sys.exit(1)
