#!/usr/bin/env python3
"""Training throughput of tutti.tensorflow against tf.distribute.MultiWorkerMirroredStrategy.

The TensorFlow twin of bench/torch_throughput.py: every rank trains a Keras model defined in
this file on synthetic data (nothing is downloaded), in the same processes, with the same
model, data and initial weights, once with Tutti's DistributedGradientTape and once under
MultiWorkerMirroredStrategy (TensorFlow's collective ops over gRPC, ring implementation). Both
step functions are tf.functions doing the same work: forward, backward, averaging the
gradients over the ranks (Tutti: one grouped allreduce; the strategy: its replica context's
all_reduce of the gradient list, which it packs), plain SGD update. The two take turns (Tutti, strategy, Tutti, ...) so that
load on a shared machine hits both alike; figures are medians over the timed iterations.

The frameworks `tutti-fit` and `local-fit` train the same model the Keras way instead:
compiled with plain SGD and stepped with `train_on_batch` (Keras' compiled train function,
what `model.fit` runs per batch), with tutti.keras' DistributedOptimizer, and alone with no
communication at all (the compute's floor: the step minus it is the communication overhead).
The strategy has no Keras counterpart here: Keras 3's `fit` and `train_on_batch` fail under
MultiWorkerMirroredStrategy (https://github.com/keras-team/keras/issues/20585, open since TensorFlow 2.16;
TensorFlow 2.21 with Keras 3.15 fails the same way), so `mwms` is its only form.

    tuttirun -np 2 python frameworks/tensorflow/bench/tf_throughput.py
    mpirun -np 4 --oversubscribe python frameworks/tensorflow/bench/tf_throughput.py --model mlp

The strategy needs a TF_CONFIG naming every worker's address before TensorFlow runs its first
op; the ranks rendezvous through files in a directory they share (one host: --rendezvous,
default /tmp/tutti-tf-bench-<parent pid>). The exit status is non-zero if the ranks' weights
differ at the end of a run, for either framework.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

FRAMEWORKS = ("tutti", "mwms", "tutti-fit", "local-fit")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["cnn", "mlp", "all"], default="all")
    p.add_argument("--frameworks", default="tutti,mwms",
                   help="comma-separated, from: %s (default tutti,mwms; they alternate)"
                        % ", ".join(FRAMEWORKS))
    p.add_argument("--batch-size", type=int, default=0,
                   help="per rank (default: 32 for cnn, 64 for mlp)")
    p.add_argument("--num-warmup-batches", type=int, default=3)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--mlp-layers", type=int, default=48)
    p.add_argument("--mlp-width", type=int, default=256)
    p.add_argument("--threads", type=int, default=1,
                   help="TensorFlow intra-op threads per rank (default 1: one rank per core)")
    p.add_argument("--rendezvous", default="",
                   help="directory the ranks share to agree on the strategy's TF_CONFIG")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (rank 0)")
    args = p.parse_args(argv)
    args.frameworks = [f for f in args.frameworks.split(",") if f]
    for f in args.frameworks:
        if f not in FRAMEWORKS:
            p.error("--frameworks: unknown framework %r (expected one of %s)"
                    % (f, ", ".join(FRAMEWORKS)))
    return args


def launcher_rank_size():
    """This process's rank and the job's size from the launcher, before Tutti's init."""
    for rank_var, size_var in (("TUTTI_RANK", "TUTTI_SIZE"),
                               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def set_tf_config(rank, size, directory, deadline=60.0):
    """Every rank writes a free port of its own; TF_CONFIG lists them all."""
    os.makedirs(directory, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = os.path.join(directory, "port.%d.tmp" % rank)
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, os.path.join(directory, "port.%d" % rank))
    ports, end = {}, time.monotonic() + deadline
    while len(ports) < size:
        for r in range(size):
            path = os.path.join(directory, "port.%d" % r)
            if r not in ports and os.path.exists(path):
                ports[r] = int(open(path).read())
        if len(ports) < size:
            if time.monotonic() > end:
                sys.exit("tf_throughput: rank %d: ranks %s did not write their port to %s "
                         "within %.0f s" % (rank, sorted(set(range(size)) - set(ports)),
                                            directory, deadline))
            time.sleep(0.05)
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": ["127.0.0.1:%d" % ports[r] for r in range(size)]},
        "task": {"type": "worker", "index": rank}})


def build_model(keras, kind, args):
    keras.utils.set_random_seed(1234)  # the same initial weights on every rank and framework
    if kind == "mlp":
        layers = [keras.Input((args.mlp_width,))]
        layers += [keras.layers.Dense(args.mlp_width, activation="relu")
                   for _ in range(args.mlp_layers)]
        layers += [keras.layers.Dense(10)]
        return keras.Sequential(layers)
    layers = [keras.Input((32, 32, 3))]
    for width in (16, 32, 64):
        layers += [keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
                   keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
                   keras.layers.MaxPooling2D()]
    layers += [keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
               keras.layers.Dense(10)]
    return keras.Sequential(layers)


def synthetic(tf, kind, batch, args, rank):
    g = tf.random.Generator.from_seed(100 + rank)
    shape = [batch, args.mlp_width] if kind == "mlp" else [batch, 32, 32, 3]
    return g.uniform(shape), g.uniform([batch], maxval=10, dtype=tf.int64)


def fit_step(name, keras, kind, args, x, y):
    """A step of Keras' own compiled train function (train_on_batch, as model.fit runs it):
    with tutti.keras' DistributedOptimizer, or with no communication."""
    model = build_model(keras, kind, args)
    opt = keras.optimizers.SGD(0.01)
    if name == "tutti-fit":
        import tutti.keras as hk
        opt = hk.DistributedOptimizer(opt)
    model.compile(optimizer=opt, jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return (lambda: model.train_on_batch(x, y, return_dict=False)), model


def main():
    args = parse_args()
    rank, size = launcher_rank_size()
    uses_mwms = any(f.startswith("mwms") for f in args.frameworks)
    if uses_mwms:
        directory = args.rendezvous or "/tmp/tutti-tf-bench-%d" % os.getppid()
        set_tf_config(rank, size, directory)

    import tensorflow as tf
    import keras

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    # The strategy configures TensorFlow's collective runtime: before any other op runs.
    strategy = None
    if uses_mwms:
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

    import tutti.tensorflow as hvd

    hvd.init()
    if (hvd.rank(), hvd.size()) != (rank, size):
        sys.exit("tf_throughput: the launcher says rank %d of %d, Tutti rank %d of %d"
                 % (rank, size, hvd.rank(), hvd.size()))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kinds = ["cnn", "mlp"] if args.model == "all" else [args.model]
    results, failed = [], False
    for kind in kinds:
        batch = args.batch_size or (32 if kind == "cnn" else 64)
        x, y = synthetic(tf, kind, batch, args, rank)
        steps = {}
        models = {}
        if "tutti" in args.frameworks:
            model = build_model(keras, kind, args)

            @tf.function
            def tutti_step(model=model):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                tape = hvd.DistributedGradientTape(tape)
                grads = tape.gradient(loss, model.trainable_variables)
                for g, v in zip(grads, model.trainable_variables):  # SGD, as the strategy's
                    v.assign_sub(0.01 * g)
                return loss

            steps["tutti"], models["tutti"] = tutti_step, model
        if "mwms" in args.frameworks:
            with strategy.scope():
                model = build_model(keras, kind, args)

            @tf.function
            def mwms_step(model=model):
                def replica_step():
                    with tf.GradientTape() as tape:
                        loss = loss_fn(y, model(x, training=True))
                    grads = tape.gradient(loss, model.trainable_variables)
                    ctx = tf.distribute.get_replica_context()
                    grads = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, grads)
                    # Already averaged: apply without a second reduction.
                    for g, v in zip(grads, model.trainable_variables):
                        v.assign_sub(0.01 * g)
                    return loss
                return strategy.run(replica_step)

            steps["mwms"], models["mwms"] = mwms_step, model
        for name in ("tutti-fit", "local-fit"):
            if name in args.frameworks:
                steps[name], models[name] = fit_step(name, keras, kind, args, x, y)
        for step in steps.values():
            for _ in range(args.num_warmup_batches):
                step()
        per_iter = {name: [] for name in steps}
        for _ in range(args.num_iters):
            for name, step in steps.items():
                start = time.perf_counter()
                for _ in range(args.num_batches_per_iter):
                    loss = step()
                float(tf.reduce_sum(strategy.experimental_local_results(loss)[0])
                      if name == "mwms" else tf.reduce_sum(loss))  # wait for the last step
                per_iter[name].append((time.perf_counter() - start) / args.num_batches_per_iter)
        row = {"model": kind, "ranks": size, "batch": batch,
               "params": int(sum(v.shape.num_elements()
                                 for v in next(iter(models.values())).trainable_variables)),
               "tensors": len(next(iter(models.values())).trainable_variables)}
        for name, times in per_iter.items():
            step_time = statistics.median(times)
            row[name + "_step_ms"] = step_time * 1000
            row[name + "_samples_per_s"] = batch * size / step_time
            flat = tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1])
                              for v in models[name].trainable_variables], 0)
            gathered = hvd.allgather(tf.reshape(flat, [1, -1]), name="check.%s.%s" % (kind, name))
            if name != "local-fit" and not bool(tf.reduce_all(gathered == gathered[0])):
                print("tf_throughput: %s/%s: the ranks' weights differ" % (kind, name),
                      file=sys.stderr)
                failed = True
        if "tutti_step_ms" in row and "mwms_step_ms" in row:
            row["tutti_vs_mwms_step_time"] = row["tutti_step_ms"] / row["mwms_step_ms"]
        if "tutti-fit_step_ms" in row and "mwms_step_ms" in row:
            row["tutti_fit_vs_mwms_step_time"] = row["tutti-fit_step_ms"] / row["mwms_step_ms"]
        if "tutti-fit_step_ms" in row and "local-fit_step_ms" in row:
            row["tutti-fit_comm_ms"] = row["tutti-fit_step_ms"] - row["local-fit_step_ms"]
        results.append(row)
        if rank == 0:
            text = "%s (%d tensors, %d parameters), %d ranks, batch %d/rank:" % (
                kind, row["tensors"], row["params"], size, batch)
            for name in per_iter:
                text += "  %s %.1f ms/step (%.0f samples/s)" % (
                    name, row[name + "_step_ms"], row[name + "_samples_per_s"])
            if "tutti_vs_mwms_step_time" in row:
                text += "  Tutti/strategy step time %.2f" % row["tutti_vs_mwms_step_time"]
            if "tutti_fit_vs_mwms_step_time" in row:
                text += "  Keras fit step/strategy step %.2f" % row["tutti_fit_vs_mwms_step_time"]
            if "tutti-fit_comm_ms" in row:
                text += "  tutti-fit comm %.1f ms" % row["tutti-fit_comm_ms"]
            print(text, flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    hvd.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
