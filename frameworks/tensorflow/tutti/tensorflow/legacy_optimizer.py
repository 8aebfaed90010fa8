"""DistributedOptimizer for TF1-style optimizers (tf.compat.v1.train.Optimizer), as
horovod.tensorflow wraps them: compute_gradients() returns the gradients reduced over the
process set; apply_gradients() applies them with the wrapped optimizer. Its local gradient
aggregation (_GradientAggregation, backward_passes_per_step) is shared with tutti.keras on
Keras 2."""

import tensorflow as tf

from tutti.tensorflow import _reduce_except_local
from tutti.tensorflow import _var_key as _key

_V1Optimizer = tf.compat.v1.train.Optimizer


class _GradientAggregation:
    """Accumulates gradients locally over `steps` calls of compute_gradients() and reduces
    them once per `steps` (Horovod's backward_passes_per_step), in TF1 graphs, inside
    tf.function and eagerly.

    compute_gradients(grads, variables): adds the gradients to the accumulators and returns,
    on every steps-th call, reduce(accumulated * scale, variables) (scale 1/steps with
    average_aggregated_gradients), else the local accumulation (not to be applied).
    apply_gradients(apply, skip): on those calls apply() (then the accumulators are cleared),
    else skip(). `counter` (a variable) holds the calls since the last reduction.
    make_variable(name, shape, dtype) creates the counter and the accumulators, zeros."""

    def __init__(self, steps, average_aggregated_gradients, reduce, make_variable):
        self.steps = int(steps)
        self._scale = 1.0 / self.steps if average_aggregated_gradients else 1.0
        self._reduce = reduce
        self._make_variable = make_variable
        self.counter = None
        self._accumulators = None
        self._is_comm_step = None

    def compute_gradients(self, grads, variables):
        dense = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        if self._accumulators is None:
            self.counter = self._make_variable("counter", [], tf.int64)
            self._accumulators = [None if g is None else self._make_variable(
                "grad_%d" % i, g.shape, g.dtype) for i, g in enumerate(dense)]
        adds = [a.assign_add(g) for a, g in zip(self._accumulators, dense) if g is not None]
        with tf.control_dependencies(adds):
            count = self.counter.assign_add(1)
        self._is_comm_step = tf.greater_equal(count, self.steps)

        def reduced():
            values = [None if a is None else a.read_value() * tf.cast(self._scale, a.dtype)
                      for a in self._accumulators]
            return [tf.zeros([]) if g is None else g for g in self._reduce(values, variables)]

        def local():
            return [tf.zeros([]) if a is None else a.read_value() for a in self._accumulators]

        out = tf.cond(self._is_comm_step, reduced, local)
        return [None if a is None else g for a, g in zip(self._accumulators, out)]

    def apply_gradients(self, apply, skip):
        if self._accumulators is None:
            raise ValueError("DistributedOptimizer: call compute_gradients() before "
                             "apply_gradients() with backward_passes_per_step > 1")

        def apply_and_clear():
            update = apply()
            with tf.control_dependencies([] if update is None else [update]):
                clear = [a.assign(tf.zeros_like(a)) for a in self._accumulators
                         if a is not None]
                clear.append(self.counter.assign(0))
            with tf.control_dependencies(clear):
                return tf.constant(True)

        def skipped():
            done = skip()
            with tf.control_dependencies([] if done is None else [done]):
                return tf.constant(False)

        return tf.cond(self._is_comm_step, apply_and_clear, skipped)


class _LegacyDistributedOptimizer(_V1Optimizer):
    """A tf.compat.v1.train.Optimizer whose compute_gradients() reduces the gradients over
    the process set (by default averages them) before they are returned.

    With backward_passes_per_step N > 1 (graph mode only, as Horovod): each call of
    compute_gradients() adds this step's gradients to local accumulators, and every N-th
    one returns their reduction (divided by N with average_aggregated_gradients); the
    apply_gradients() of that step applies them and clears the accumulators, the others
    apply nothing (global_step still counts every call)."""

    def __init__(self, optimizer, name, use_locking, allreduce_grads, process_set,
                 sparse_as_dense, backward_passes_per_step, average_aggregated_gradients,
                 scale_local_gradients):
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._allreduce_grads = allreduce_grads
        self.process_set = process_set
        self._sparse_as_dense = sparse_as_dense
        self.scale_local_gradients = scale_local_gradients
        self._local_vars = set()
        self._agg_helper = None
        if backward_passes_per_step > 1:
            if tf.executing_eagerly():
                raise ValueError("backward_passes_per_step > 1 is not supported for TF1-style "
                                 "(tf.compat.v1.train) optimizers in eager execution (as "
                                 "Horovod): use a Keras optimizer, or graph mode")
            self._agg_helper = _GradientAggregation(
                backward_passes_per_step, average_aggregated_gradients, self._reduce,
                self._local_variable)

    def _local_variable(self, name, shape, dtype):
        with tf.compat.v1.variable_scope(self.get_name() + "_aggregation"):
            return tf.compat.v1.get_local_variable(
                name, shape=shape, dtype=dtype, initializer=tf.compat.v1.zeros_initializer(),
                trainable=False, use_resource=True)

    def register_local_var(self, var):
        """The gradient of `var` stays local: not reduced (divided by the set's size when
        scale_local_gradients)."""
        self._local_vars.add(_key(var))

    def _reduce(self, grads, variables):
        return _reduce_except_local(self._allreduce_grads, list(grads), variables,
                                    self._local_vars, self.scale_local_gradients,
                                    self.process_set)

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's gradients, reduced over the process set."""
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        if not grads_and_vars:
            return grads_and_vars
        grads, variables = (list(t) for t in zip(*grads_and_vars))
        if self._agg_helper is None:
            return list(zip(self._reduce(grads, variables), variables))
        return list(zip(self._agg_helper.compute_gradients(grads, variables), variables))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Applies the gradients with the wrapped optimizer (with backward_passes_per_step,
        only on the steps that reduced them, then clears the accumulators)."""
        if self._agg_helper is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                                   name=name)
        applied = self._agg_helper.apply_gradients(
            lambda: self._optimizer.apply_gradients(grads_and_vars, name=name), lambda: None)
        if global_step is None:
            return applied.op
        with tf.control_dependencies([applied]):
            return global_step.assign_add(1).op

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)
