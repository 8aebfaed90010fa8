"""tutti.tensorflow.DistributedOptimizer around TF1-style optimizers
(tf.compat.v1.train.Optimizer): reduced gradients eagerly and in graph mode, local variables,
process sets, and backward_passes_per_step in graph mode (Horovod's expected values)."""

import numpy as np
import pytest
import tensorflow as tf

import tutti.tensorflow as hvd


class _RankGradient(tf.compat.v1.train.Optimizer):
    """compute_gradients() gives this rank's number as the gradient of one variable;
    applying adds the gradient to the variable (Horovod's TestOptimizer)."""

    def __init__(self, variable, grad=None, **kwargs):
        super().__init__(name=kwargs.pop("name", "rank_gradient"), use_locking=False)
        self.variable = variable
        self.grad = grad

    def compute_gradients(self, *args, **kwargs):
        g = self.grad if self.grad is not None else tf.constant([float(hvd.rank())])
        return [(g, self.variable)]

    def _apply_dense(self, grad, var):
        return var.assign_add(grad)

    def _resource_apply_dense(self, grad, var):
        return var.assign_add(grad)


def test_eager_gradients_are_averaged_and_applied():
    var = tf.Variable([1.0, 2.0])
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
    assert isinstance(opt, tf.compat.v1.train.Optimizer)
    # loss = (rank + 1) * sum(var): gradient (rank + 1) on every element.
    grads_and_vars = opt.compute_gradients(lambda: float(hvd.rank() + 1) * tf.reduce_sum(var),
                                           var_list=[var])
    mean = sum(r + 1 for r in range(hvd.size())) / hvd.size()
    np.testing.assert_allclose(grads_and_vars[0][0].numpy(), [mean, mean])
    opt.apply_gradients(grads_and_vars)
    np.testing.assert_allclose(var.numpy(), [1.0 - 0.5 * mean, 2.0 - 0.5 * mean])
    gathered = hvd.allgather(var.read_value()[None, :]).numpy()
    np.testing.assert_array_equal(gathered, np.repeat(gathered[:1], hvd.size(), axis=0))


def test_eager_local_variable_is_not_reduced():
    shared, local = tf.Variable([0.0]), tf.Variable([0.0])
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
    opt.register_local_var(local)
    gv = opt.compute_gradients(lambda: float(hvd.rank() + 1) * (shared[0] + local[0]),
                               var_list=[shared, local])
    mean = sum(r + 1 for r in range(hvd.size())) / hvd.size()
    np.testing.assert_allclose(gv[0][0].numpy(), [mean])
    # scale_local_gradients (default): the local gradient divided by the set's size
    np.testing.assert_allclose(gv[1][0].numpy(), [(hvd.rank() + 1) / hvd.size()])


@pytest.mark.skipif("hvd.size() < 2")
def test_eager_process_set_members_only():
    # Ranks 0 and 1: the global set at 2 ranks (a second set of every rank is refused).
    ps = hvd.global_process_set if hvd.size() == 2 else hvd.add_process_set([0, 1])
    try:
        var = tf.Variable([0.0])
        opt = hvd.DistributedOptimizer(_RankGradient(var), process_set=ps)
        (grad, _), = opt.compute_gradients()
        expected = 0.5 if hvd.rank() in (0, 1) else float(hvd.rank())
        np.testing.assert_allclose(grad.numpy(), [expected])
    finally:
        if ps is not hvd.global_process_set:
            hvd.remove_process_set(ps)


def test_backward_passes_per_step_needs_graph_mode():
    with pytest.raises(ValueError, match="eager execution"):
        hvd.DistributedOptimizer(_RankGradient(tf.Variable([0.0])), backward_passes_per_step=2)


def _expected_after(batch, steps, average):
    # Horovod's _grad_agg_compute_expected_value: per completed aggregation, the sum over
    # `steps` batches of the ranks' mean gradient (divided by steps when averaging).
    per_batch = sum(range(hvd.size())) / hvd.size()
    per_aggregation = steps * per_batch / (steps if average else 1)
    return ((batch + 1) // steps) * per_aggregation


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("sparse", [False, True])
def test_graph_mode_backward_passes_per_step(average, sparse):
    steps = 4
    with tf.Graph().as_default():
        var = tf.compat.v1.get_variable("v", initializer=[0.0], use_resource=True)
        grad = (tf.IndexedSlices(tf.constant([float(hvd.rank())]), tf.constant([0]),
                                 tf.constant([1])) if sparse else None)
        opt = hvd.DistributedOptimizer(_RankGradient(var, grad=grad),
                                       backward_passes_per_step=steps,
                                       average_aggregated_gradients=average,
                                       sparse_as_dense=sparse)
        grads_and_vars = opt.compute_gradients()
        global_step = tf.compat.v1.get_variable(
            "step", initializer=tf.constant(0, tf.int64), trainable=False, use_resource=True)
        update = opt.apply_gradients(grads_and_vars, global_step=global_step)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(tf.compat.v1.local_variables_initializer())
            for batch in range(10):
                sess.run(update)
                assert sess.run(var)[0] == pytest.approx(_expected_after(batch, steps, average))
                assert sess.run(global_step) == batch + 1  # every call counts
