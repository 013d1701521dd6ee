#!/usr/bin/env python3
"""A tiny multi-input click model on the Open Bandit Dataset, and events to score with it.

    PYTHONPATH=~/.cache/riffle/python python3 scripts/train-obd-ctr.py train [--csv ALL.CSV]
    PYTHONPATH=~/.cache/riffle/python python3 scripts/train-obd-ctr.py reference EVENTS.jsonl

`train` reads the OBD small version's `random/all/all.csv` (10,000 logged impressions with
click labels; Saito et al., "Open Bandit Dataset and Pipeline", arXiv:2008.07146, Apache-2.0),
trains a 2-layer MLP with numpy (full-batch Adam on the log loss) and writes

  models/obd_ctr.onnx                 user_feat f32[N,4], affinity f32[N,80], position i64[N]
                                      -> p_click f32[N]
  data/clickstream/obd-events.jsonl   the first 300 impressions as {"event_id", "user_feat",
                                      "affinity", "position"}

`user_feature_0..3` are hashed strings: each becomes int(h[:8], 16) / 2**32, a number in
[0, 1). Inputs are standardised inside the model (folded into the first layer).

`reference` scores an events file with numpy from the model file's own weights (no ONNX
Runtime), printing {"event_id", "p_click"} per line: tests/tabular.rs compares Riffle's output
with it. Needs numpy and onnx (scripts/setup.sh installs them under ~/.cache/riffle/python).
"""

import argparse
import csv
import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CSV = os.path.join(
    REPO, "..", "shared", "assets", "clickstream", "obd", "random", "all", "all.csv"
)
MODEL = os.path.join(REPO, "models", "obd_ctr.onnx")
EVENTS = os.path.join(REPO, "data", "clickstream", "obd-events.jsonl")
USER_FEATURES = 4
AFFINITIES = 80
HIDDEN = 16
EVENT_COUNT = 300
SEED = 7


def hashed(text):
    """A hashed-string feature as a number in [0, 1)."""
    return int(text[:8], 16) / 2**32


def f32(x):
    """`x` rounded to float32, written so that it parses back to exactly that float32."""
    return float(np.float32(x))


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    user = np.array(
        [[hashed(r[f"user_feature_{i}"]) for i in range(USER_FEATURES)] for r in rows],
        dtype=np.float32,
    )
    affinity = np.array(
        [[float(r[f"user-item_affinity_{i}"]) for i in range(AFFINITIES)] for r in rows],
        dtype=np.float32,
    )
    position = np.array([int(r["position"]) for r in rows], dtype=np.int64)
    click = np.array([int(r["click"]) for r in rows], dtype=np.float32)
    ids = [int(r[""]) if r.get("") not in (None, "") else i for i, r in enumerate(rows)]
    return ids, user, affinity, position, click


def features(user, affinity, position):
    return np.concatenate(
        [user, affinity, position.astype(np.float32)[:, None]], axis=1
    ).astype(np.float32)


def train(x, y, epochs=400, lr=0.01, l2=1e-3):
    rng = np.random.default_rng(SEED)
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    std[std < 1e-6] = 1.0
    z = (x - mean) / std
    w1 = rng.normal(0, 1 / np.sqrt(z.shape[1]), (z.shape[1], HIDDEN))
    b1 = np.zeros(HIDDEN)
    w2 = rng.normal(0, 1 / np.sqrt(HIDDEN), (HIDDEN, 1))
    b2 = np.array([np.log(y.mean() / (1 - y.mean()))])
    params = [w1, b1, w2, b2]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t in range(1, epochs + 1):
        h_pre = z @ w1 + b1
        h = np.maximum(h_pre, 0)
        p = 1 / (1 + np.exp(-(h @ w2 + b2)[:, 0]))
        g_logit = (p - y)[:, None] / len(y)
        g_w2 = h.T @ g_logit + l2 * w2
        g_b2 = g_logit.sum(axis=0)
        g_h = g_logit @ w2.T * (h_pre > 0)
        g_w1 = z.T @ g_h + l2 * w1
        g_b1 = g_h.sum(axis=0)
        for i, g in enumerate([g_w1, g_b1, g_w2, g_b2]):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            params[i] -= lr * (m[i] / (1 - 0.9**t)) / (np.sqrt(v[i] / (1 - 0.999**t)) + 1e-8)
    w1, b1, w2, b2 = params
    loss = -np.mean(y * np.log(p + 1e-9) + (1 - y) * np.log(1 - p + 1e-9))
    # Standardisation folded into the first layer: the model takes raw features.
    return w1 / std[:, None], b1 - (mean / std) @ w1, w2, b2, loss


def auc(score, y):
    order = np.argsort(score)
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    positives = y.sum()
    negatives = len(y) - positives
    return (ranks[y == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives)


def export(w1, b1, w2, b2, path):
    init = [
        numpy_helper.from_array(w1.astype(np.float32), "W1"),
        numpy_helper.from_array(b1.astype(np.float32), "b1"),
        numpy_helper.from_array(w2.astype(np.float32), "W2"),
        numpy_helper.from_array(b2.astype(np.float32), "b2"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "flat"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
    ]
    nodes = [
        helper.make_node("Cast", ["position"], ["position_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["position_f", "axis1"], ["position_col"]),
        helper.make_node("Concat", ["user_feat", "affinity", "position_col"], ["x"], axis=1),
        helper.make_node("MatMul", ["x", "W1"], ["h_mm"]),
        helper.make_node("Add", ["h_mm", "b1"], ["h_pre"]),
        helper.make_node("Relu", ["h_pre"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["o_mm"]),
        helper.make_node("Add", ["o_mm", "b2"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["p_col"]),
        helper.make_node("Reshape", ["p_col", "flat"], ["p_click"]),
    ]
    graph = helper.make_graph(
        nodes,
        "obd_ctr",
        [
            helper.make_tensor_value_info("user_feat", TensorProto.FLOAT, ["N", USER_FEATURES]),
            helper.make_tensor_value_info("affinity", TensorProto.FLOAT, ["N", AFFINITIES]),
            helper.make_tensor_value_info("position", TensorProto.INT64, ["N"]),
        ],
        [helper.make_tensor_value_info("p_click", TensorProto.FLOAT, ["N"])],
        init,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17)],
        producer_name="riffle scripts/train-obd-ctr.py",
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def forward(model_path, user, affinity, position):
    """p_click from the model file's weights, in float32 like the model."""
    weights = {
        t.name: numpy_helper.to_array(t) for t in onnx.load(model_path).graph.initializer
    }
    x = features(user, affinity, position)
    h = np.maximum(x @ weights["W1"] + weights["b1"], np.float32(0))
    logit = (h @ weights["W2"] + weights["b2"])[:, 0]
    return (1 / (1 + np.exp(-logit.astype(np.float64)))).astype(np.float32)


def command_train(args):
    ids, user, affinity, position, click = read_csv(args.csv)
    x = features(user, affinity, position)
    w1, b1, w2, b2, loss = train(x, click)
    export(w1, b1, w2, b2, args.model)
    p = forward(args.model, user, affinity, position)
    print(
        f"trained on {len(click)} impressions ({int(click.sum())} clicks): log loss {loss:.4f}, "
        f"AUC {auc(p, click):.3f}; wrote {args.model} ({os.path.getsize(args.model)} bytes)",
        file=sys.stderr,
    )
    with open(args.events, "w") as f:
        for i in range(min(EVENT_COUNT, len(ids))):
            event = {
                "event_id": ids[i],
                "user_feat": [f32(v) for v in user[i]],
                "affinity": [f32(v) for v in affinity[i]],
                "position": int(position[i]),
            }
            f.write(json.dumps(event, separators=(",", ":")) + "\n")
    print(f"wrote {min(EVENT_COUNT, len(ids))} events to {args.events}", file=sys.stderr)


def command_reference(args):
    events = [json.loads(line) for line in open(args.events) if line.strip()]
    user = np.array([e["user_feat"] for e in events], dtype=np.float32)
    affinity = np.array([e["affinity"] for e in events], dtype=np.float32)
    position = np.array([e["position"] for e in events], dtype=np.int64)
    for e, p in zip(events, forward(args.model, user, affinity, position)):
        print(json.dumps({"event_id": e["event_id"], "p_click": float(p)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train the model and write the events file")
    t.add_argument("--csv", default=DEFAULT_CSV, help="OBD random/all/all.csv")
    t.add_argument("--model", default=MODEL)
    t.add_argument("--events", default=EVENTS)
    r = sub.add_parser("reference", help="score an events file with numpy")
    r.add_argument("events")
    r.add_argument("--model", default=MODEL)
    args = parser.parse_args()
    {"train": command_train, "reference": command_reference}[args.command](args)


if __name__ == "__main__":
    main()
