"""DistributedOptimizer for TF1-style optimizers (tf.compat.v1.train.Optimizer), as
horovod.tensorflow wraps them: compute_gradients() returns the gradients reduced over the
process set; apply_gradients() applies them with the wrapped optimizer."""

import tensorflow as tf

from tutti.tensorflow import _var_key as _key

_V1Optimizer = tf.compat.v1.train.Optimizer


class _LegacyDistributedOptimizer(_V1Optimizer):
    """A tf.compat.v1.train.Optimizer whose compute_gradients() reduces the gradients over
    the process set (by default averages them) before they are returned.

    With backward_passes_per_step N > 1 (graph mode only, as Horovod): each call of
    compute_gradients() adds this step's gradients to local accumulators, and every N-th
    one returns their reduction (divided by N with average_aggregated_gradients); the
    apply_gradients() of that step applies them and clears the accumulators, the others
    apply nothing (global_step still counts every call)."""

    def __init__(self, optimizer, name, use_locking, allreduce_grads, process_set_size,
                 process_set, sparse_as_dense, backward_passes_per_step,
                 average_aggregated_gradients, scale_local_gradients):
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._allreduce_grads = allreduce_grads
        self._set_size = process_set_size
        self.process_set = process_set
        self._sparse_as_dense = sparse_as_dense
        self._steps = int(backward_passes_per_step)
        self._average_aggregated = average_aggregated_gradients
        self.scale_local_gradients = scale_local_gradients
        self._local_vars = set()
        self._counter = None
        self._accumulators = None
        if self._steps > 1 and tf.executing_eagerly():
            raise ValueError("backward_passes_per_step > 1 is not supported for TF1-style "
                             "(tf.compat.v1.train) optimizers in eager execution (as "
                             "Horovod): use a Keras optimizer, or graph mode")

    def register_local_var(self, var):
        """The gradient of `var` stays local: not reduced (divided by the set's size when
        scale_local_gradients)."""
        self._local_vars.add(_key(var))

    def _reduce(self, grads, variables):
        grads = list(grads)
        at = [i for i, v in enumerate(variables) if _key(v) not in self._local_vars]
        reduced = self._allreduce_grads([grads[i] for i in at], [variables[i] for i in at])
        for i, g in zip(at, reduced):
            grads[i] = g
        if self.scale_local_gradients and self._local_vars:
            n = self._set_size(self.process_set)
            for i, v in enumerate(variables):
                g = grads[i]
                if _key(v) in self._local_vars and g is not None:
                    grads[i] = (tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                                if isinstance(g, tf.IndexedSlices) else g / n)
        return grads

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's gradients, reduced over the process set."""
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        if not grads_and_vars:
            return grads_and_vars
        grads, variables = (list(t) for t in zip(*grads_and_vars))
        if self._steps == 1:
            return list(zip(self._reduce(grads, variables), variables))
        return list(zip(self._aggregate(grads, variables), variables))

    def _aggregate(self, grads, variables):
        dense = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        if self._accumulators is None:
            with tf.compat.v1.variable_scope(self.get_name() + "_aggregation"):
                self._counter = tf.compat.v1.get_local_variable(
                    "counter", initializer=tf.constant(0, tf.int64), trainable=False,
                    use_resource=True)
                self._accumulators = [
                    None if g is None else tf.compat.v1.get_local_variable(
                        "grad_%d" % i, initializer=tf.zeros(g.shape, g.dtype),
                        trainable=False, use_resource=True)
                    for i, g in enumerate(dense)]
        adds = [a.assign_add(g) for a, g in zip(self._accumulators, dense) if g is not None]
        with tf.control_dependencies(adds):
            count = self._counter.assign_add(1)
        self._is_comm_step = tf.equal(count % self._steps, 0)
        scale = 1.0 / self._steps if self._average_aggregated else 1.0

        def reduced():
            values = [None if a is None else a.read_value() * tf.cast(scale, a.dtype)
                      for a in self._accumulators]
            return [tf.zeros([]) if g is None else g
                    for g in self._reduce(values, variables)]

        def local():
            return [tf.zeros([]) if a is None else a.read_value() for a in self._accumulators]

        out = tf.cond(self._is_comm_step, reduced, local)
        return [None if a is None else g for a, g in zip(self._accumulators, out)]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Applies the gradients with the wrapped optimizer (with backward_passes_per_step,
        only on the steps that reduced them, then clears the accumulators)."""
        if self._steps == 1:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                                   name=name)
        if self._accumulators is None:
            raise ValueError("DistributedOptimizer: call compute_gradients() before "
                             "apply_gradients() with backward_passes_per_step > 1")

        def apply():
            update = self._optimizer.apply_gradients(grads_and_vars, name=name)
            with tf.control_dependencies([update]):
                clear = [a.assign(tf.zeros_like(a)) for a in self._accumulators
                         if a is not None]
            with tf.control_dependencies(clear):
                return tf.constant(True)

        applied = tf.cond(self._is_comm_step, apply, lambda: tf.constant(False))
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
