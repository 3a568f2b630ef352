"""A complete instrumented PyTorch training script: copy it, swap in your model and data.

It trains a small residual CNN on synthetic 3x32x32 images whose "decoding" waits 24 ms per
image, like reading and decoding a JPEG. It trains for ``--seconds`` (default ``$DEMO_SECONDS``, else 30)
whatever the loader, so a diagnosis window fits inside either run. Two loaders show remedy M1:

    python examples/train_resnet_like.py --loader slow    # input-bound: the training process decodes
    python examples/train_resnet_like.py --loader fixed   # 32 worker processes decode ahead

On one CPU core a batch of 32 computes in 0.05-0.15 s while one process decodes it in 0.77 s, so
``--loader slow`` spends about 85-95% of its time in phase "data" (the M1 limit is
``input_bound_share`` in thresholds.yml, 30%); ``--loader fixed`` brings that to 5-15%. The model
is wide enough (``--width 64``) that a step's compute stays well above what 32 workers need per
batch on a fast core too: with ``--width 32`` a recent CPU computes a batch in 0.02 s, the workers
barely keep up and "fixed" still waits 25-30% of the time.
With an exporter on this node (``gpu-exporter --simulate demo-training`` works without a GPU),
``gpu-exporter diagnose`` names the cause. On CUDA the GPU UUID is found automatically; on a CPU
the job names the GPU it reports for with ``CUDA_VISIBLE_DEVICES=GPU-...`` (see the README).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import torch
from gpu_exporter import training
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random images with labels; each item costs ``decode_ms`` of waiting, like a slow decoder."""

    def __init__(self, size: int, decode_ms: float, image_size: int) -> None:
        self.size = size
        self.decode_s = decode_ms / 1000
        self.image_size = image_size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.decode_s)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(3, self.image_size, self.image_size, generator=generator), torch.tensor(index % 10)


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU(),
                                  nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


def resnet_like(classes: int = 10, width: int = 32) -> nn.Module:
    """A tiny ResNet: stem, two residual stages, global pooling, a linear head."""
    return nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU(), Block(width),
                         nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(), Block(2 * width),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes))


Batch = tuple[torch.Tensor, torch.Tensor]


def make_loader(kind: str, dataset: SyntheticImages, batch_size: int, cuda: bool) -> DataLoader[Batch]:
    if kind == "slow":  # everything in the training process: the GPU waits while images decode
        return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=0)
    # remedy M1: decode in parallel worker processes, ahead of time, into pinned memory. Decoding here
    # waits (like I/O) rather than computes, so more workers than cores still help.
    workers = 32
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # "more workers than cores"
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers, prefetch_factor=4,
                      persistent_workers=True, pin_memory=cuda)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--loader", choices=["slow", "fixed"], default="slow",
                        help="slow: input-bound single-process loader; fixed: parallel prefetching workers")
    parser.add_argument("--run", default=None, help="run name (default: resnet-like-<loader>)")
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("DEMO_SECONDS", "30")),
                        help="train this long (whole steps), then stop (default: $DEMO_SECONDS, else 30)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for compute (1 keeps step times steady on a busy 2-core machine)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--images", type=int, default=4096, help="images per epoch")
    parser.add_argument("--width", type=int, default=64, help="channels of the first residual stage")
    parser.add_argument("--image-size", type=int, default=32, help="images are 3 x SIZE x SIZE")
    parser.add_argument("--decode-ms", type=float, default=24.0, help="simulated decode wait per image")
    parser.add_argument("--metrics-every", type=int, default=1, help="compute accuracy every N steps (M2)")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="save a checkpoint every N steps")
    parser.add_argument("--sync-every", type=int, default=0,
                        help="CUDA only: synchronise at phase boundaries every N steps for honest timing")
    parser.add_argument("--push-interval", type=float, default=0.25, help="seconds between pushes")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if cuda else "cpu")
    model = resnet_like(width=args.width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = SyntheticImages(args.images, args.decode_ms, args.image_size)
    loader = make_loader(args.loader, dataset, args.batch_size, cuda)
    checkpoint = os.path.join(tempfile.gettempdir(), "resnet-like.pt")

    # URL from $GPU_EXPORTER_URL (default http://127.0.0.1:9445), token from $GPU_EXPORTER_TOKEN.
    run = training.start(args.run or f"resnet-like-{args.loader}", push_interval=args.push_interval,
                         sync_every=args.sync_every)
    compute, metrics, save = run.phase("compute"), run.phase("metrics"), run.phase("checkpoint")
    step, epoch, loss, accuracy = 0, 0, torch.tensor(float("nan")), float("nan")
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        for images, labels in run.data(loader):  # time blocked waiting for a batch is phase "data"
            with compute:
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                optimizer.zero_grad(set_to_none=True)
                logits = model(images)
                loss = nn.functional.cross_entropy(logits, labels)
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
            step += 1
            if step % args.metrics_every == 0:
                with metrics:  # .item() waits for the GPU: use --sync-every for honest compute time
                    accuracy = (logits.argmax(1) == labels).float().mean().item()
            if step % args.checkpoint_every == 0:
                with save:
                    torch.save(model.state_dict(), checkpoint)
            run.step(samples=len(images))
            if time.monotonic() >= deadline:
                break
        print(f"epoch {epoch}: {step} steps, loss {loss.item():.3f} accuracy {accuracy:.2f}", flush=True)
        epoch += 1
    shares = run.phase_seconds()
    total = sum(shares.values())
    print("time per phase: " + ", ".join(f"{p} {s / total:.0%}" for p, s in shares.items() if s))
    run.close()


if __name__ == "__main__":
    main()
