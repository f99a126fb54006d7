#!/usr/bin/env python3
"""The training peer of `opforge train`: the same MLP (784-512-256-10, ReLU), the same data
(Fashion-MNIST from the Debian package's IDX files), batch size, optimiser (SGD, momentum 0.9,
lr 0.05), loss and epochs, in PyTorch with the same thread count. Prints one line per epoch:
seconds, samples/s and test accuracy. Used by tests/bench/train_vs_torch.sh."""
import argparse
import gzip
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    load = lambda s: (
        torch.from_numpy(idx(f"{a.data}/{s}-images-idx3-ubyte.gz").astype(np.float32) / 255),
        torch.from_numpy(idx(f"{a.data}/{s}-labels-idx1-ubyte.gz").astype(np.int64)),
    )
    (x, y), (tx, ty) = load("train"), load("t10k")
    x, tx = x.reshape(-1, 784), tx.reshape(-1, 784)
    net = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(a.seed)
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


if __name__ == "__main__":
    main()
