"""Horovod-style elastic TensorFlow scripts, run by test_tf_elastic.py under tuttirun's elastic
flags with hooks that make faults happen at a chosen step:

--mode tape: a linear model trained eagerly with DistributedGradientTape and a Keras SGD
optimizer, kept in a TensorFlowKerasState (the pattern of horovod.tensorflow.elastic); step k
of a world of n ranks gives rank r the samples (k*n + r)*BATCH ... of the data, so replay()
can recompute the model from the world sizes of the steps alone.
--mode fit: Keras' model.fit (a tf.function) with tutti.keras.elastic's callbacks under
hvd.elastic.run, each rank on its shard of the data.

In tape mode the state also keeps `sizes`, the world size of every step the weights are
made of: committed and restored with the rest, so a worker's final `sizes` is the schedule
replay() needs. Every rank appends JSON lines to --log: "start" at each try of the training
function, an "error" line for each error that ends one (its class, whether it is a
HorovodInternalError / a tf.errors.OpError) and "done". Each worker writes its final weights
to --out/<worker>.npz.
"""
import argparse
import json
import os
import signal
import time

import numpy as np

N_SAMPLES, BATCH, FEATURES = 48, 2, 4


def make_data():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((N_SAMPLES, FEATURES))
    y = x @ np.arange(1.0, FEATURES + 1).reshape(FEATURES, 1) + 0.5
    return x, y


def initial_weights():
    return [np.linspace(-0.5, 0.5, FEATURES).reshape(FEATURES, 1), np.zeros(1)]


def batch_of(x, y, step, size, rank):
    rows = [((step * size + rank) * BATCH + i) % N_SAMPLES for i in range(BATCH)]
    return x[rows], y[rows]


def replay(schedule, lr):
    """The tape mode's training without TensorFlow: each step averages the gradients of
    the mean squared error of the schedule[i] ranks of its world. The learning rate is
    float32's, as Keras keeps it."""
    lr = float(np.float32(lr))
    x, y = make_data()
    kernel, bias = initial_weights()
    for step, size in enumerate(schedule):
        g_kernel, g_bias = np.zeros_like(kernel), np.zeros_like(bias)
        for rank in range(size):
            xb, yb = batch_of(x, y, step, size, rank)
            err = xb @ kernel + bias - yb  # d mean(err^2) = 2 err / BATCH
            g_kernel += xb.T @ (2 * err / BATCH)
            g_bias += (2 * err / BATCH).sum(axis=0)
        kernel = kernel - lr * g_kernel / size
        bias = bias - lr * g_bias / size
    return [kernel, bias]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["tape", "fit"], default="tape")
    p.add_argument("--steps", type=int, default=12, help="tape: steps in all")
    p.add_argument("--epochs", type=int, default=3, help="fit: epochs in all")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--commit-every", type=int, default=2)
    p.add_argument("--log", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kill-rank", type=int, default=-1, help="this rank of generation 0 ...")
    p.add_argument("--kill-at", type=int, default=-1, help="... SIGKILLs itself at this step")
    p.add_argument("--grow-file", help="rank 0 of generation 0 writes --grow-hosts here ...")
    p.add_argument("--grow-hosts")
    p.add_argument("--grow-at", type=int, default=-1, help="... at this step")
    args = p.parse_args()

    import keras
    import tensorflow as tf
    import tutti.keras as hk
    import tutti.tensorflow as hvd
    hvd.init()
    worker = os.environ.get("TUTTI_ELASTIC_WORKER", "w?")
    log = open(args.log, "a")

    def note(**record):
        record.update(worker=worker, gen=hvd.basics._elastic_generation())
        log.write(json.dumps(record) + "\n")
        log.flush()

    def faults(step):
        first_generation = hvd.basics._elastic_generation() == 0
        if first_generation and hvd.rank() == args.kill_rank and step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if first_generation and hvd.rank() == 0 and step == args.grow_at:
            with open(args.grow_file + ".tmp", "w") as f:
                f.write(args.grow_hosts + "\n")
            os.replace(args.grow_file + ".tmp", args.grow_file)
            deadline = time.monotonic() + 30
            while not hvd.basics._hosts_updated() and time.monotonic() < deadline:
                time.sleep(0.1)

    def noting_errors(func):
        def wrapper(state):
            try:
                return func(state)
            except Exception as e:
                note(event="error", cls=type(e).__name__,
                     internal=isinstance(e, hvd.HorovodInternalError),
                     op_error=isinstance(e, tf.errors.OpError))
                raise
        return wrapper

    x, y = make_data()
    model = keras.Sequential([keras.Input((FEATURES,), dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")])
    model.set_weights(initial_weights())
    optimizer = keras.optimizers.SGD(args.lr)

    if args.mode == "tape":
        state = hvd.elastic.TensorFlowKerasState(model, optimizer, batch=0, sizes=[])

        @hvd.elastic.run
        @noting_errors
        def train(state):
            note(event="start", rank=hvd.rank(), size=hvd.size(), batch=state.batch)
            while state.batch < args.steps:
                faults(state.batch)
                xb, yb = batch_of(x, y, state.batch, hvd.size(), hvd.rank())
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((model(xb) - yb) ** 2)
                tape = hvd.DistributedGradientTape(tape)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                state.batch += 1
                state.sizes = state.sizes + [hvd.size()]  # a new list: the saved one stays
                if state.batch % args.commit_every == 0:
                    state.commit()
    else:
        model.compile(optimizer=hk.DistributedOptimizer(optimizer), loss="mse",
                      jit_compile=False)
        state = hk.elastic.KerasState(model, batch=0, epoch=0)

        class Faults(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                faults(state.epoch * 1000 + batch)

        callbacks = [Faults(), hk.elastic.CommitStateCallback(state, args.commit_every),
                     hk.elastic.UpdateBatchStateCallback(state),
                     hk.elastic.UpdateEpochStateCallback(state)]

        @hk.elastic.run
        @noting_errors
        def train(state):
            note(event="start", rank=hvd.rank(), size=hvd.size(), epoch=state.epoch)
            model.fit(x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()], batch_size=BATCH,
                      epochs=args.epochs - state.epoch, shuffle=False, verbose=0,
                      callbacks=callbacks)

    train(state)
    note(event="done", rank=hvd.rank(), size=hvd.size(), batch=state.batch,
         epoch=getattr(state, "epoch", None), sizes=getattr(state, "sizes", None))
    np.savez(os.path.join(args.out, worker + ".npz"), *model.get_weights())
    hvd.shutdown()


if __name__ == "__main__":
    main()
