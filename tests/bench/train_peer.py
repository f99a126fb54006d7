#!/usr/bin/env python3
"""The training peer of `opforge train`: the same models (mlp: 784-512-256-10, ReLU; cnn: conv 5x5
32, max-pool 2, conv 5x5 64, max-pool 2, linear 128, linear 10), the same data (Fashion-MNIST from
the Debian package's IDX files, standardised), batch size, optimiser (SGD, momentum 0.9, lr 0.05,
cosine schedule), loss and thread count, in PyTorch.

Without --steps: trains whole epochs and prints one line per epoch (seconds, samples/s, test
accuracy); tests/bench/train_vs_torch.sh reads them. With --steps N: times N training steps after
--warmup steps and prints one JSON object: samples/s and the milliseconds per step spent on the
batch (data), forward pass and loss, backward pass and optimiser step; `opforge bench --train`
reads it."""
import argparse
import gzip
import json
import struct
import time

import numpy as np
import torch


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = struct.unpack(">" + "I" * rank, data[4 : 4 + 4 * rank])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * rank).reshape(dims)


def model(name):
    nn = torch.nn
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                             nn.ReLU(), nn.Linear(256, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 5),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 4 * 4, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    load = lambda s: (
        torch.from_numpy(idx(f"{a.data}/{s}-images-idx3-ubyte.gz").astype(np.float32) / 255),
        torch.from_numpy(idx(f"{a.data}/{s}-labels-idx1-ubyte.gz").astype(np.int64)),
    )
    (x, y), (tx, ty) = load("train"), load("t10k")
    x, tx = x.reshape(-1, 1, 28, 28), tx.reshape(-1, 1, 28, 28)
    # Standardised by the training images' mean and deviation, as opforge train does.
    mean, std = x.double().mean().item(), x.double().std(unbiased=False).item()
    x, tx = (x - mean) / std, (tx - mean) / std
    net = model(a.model)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    # opforge train's default schedule: cosine annealing to 0 over the epochs, stepped per epoch.
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, a.epochs)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(a.seed)
    if a.steps:
        order = torch.randperm(len(y), generator=g)
        phases = {"data": 0.0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        for s in range(a.warmup + a.steps):
            if s == a.warmup:
                phases = dict.fromkeys(phases, 0.0)
                start = time.perf_counter()
            t0 = time.perf_counter()
            at = (s * a.batch_size) % (len(y) - a.batch_size)
            b = order[at : at + a.batch_size]
            xb, yb = x[b], y[b]
            t1 = time.perf_counter()
            loss = loss_fn(net(xb), yb)
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            opt.step()
            opt.zero_grad()
            loss.item()
            t4 = time.perf_counter()
            for k, d in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                phases[k] += d
        seconds = time.perf_counter() - start
        print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                          "samples_per_second": a.steps * a.batch_size / seconds,
                          "ms_per_step": {k: 1e3 * v / a.steps for k, v in phases.items()}}))
        return
    for epoch in range(a.epochs):
        start = time.perf_counter()
        order = torch.randperm(len(y), generator=g)
        for i in range(0, len(y), a.batch_size):
            idx_b = order[i : i + a.batch_size]
            opt.zero_grad()
            loss = loss_fn(net(x[idx_b]), y[idx_b])
            loss.backward()
            opt.step()
        seconds = time.perf_counter() - start
        with torch.no_grad():
            acc = (net(tx).argmax(1) == ty).float().mean().item()
        print(f"torch epoch {epoch + 1}: {seconds:.2f} s, {len(y) / seconds:.0f} samples/s, "
              f"test accuracy {100 * acc:.2f}%", flush=True)
        schedule.step()


if __name__ == "__main__":
    main()
