"""DINO's schedules, parameter groups, frozen last layer and student step, transcribed for the tests.

Source: https://github.com/facebookresearch/dino, commit 7c446df5b9f45747937fb0d72314eb9f7b66930a
(2023-04-27):

* ``cosine_scheduler``, ``cancel_gradients_last_layer``, ``get_params_groups`` — ``utils.py``, verbatim;
* ``teacher_temp_schedule`` — the table built in ``DINOLoss.__init__`` of ``main_dino.py`` (indexed by the
  epoch in ``DINOLoss.forward``: ``temp = self.teacher_temp_schedule[epoch]``);
* ``student_step`` — one iteration of ``train_one_epoch`` in ``main_dino.py`` (fp32 branch, the EMA
  teacher update left out): the lr / weight-decay assignment per param group, ``zero_grad``, backward,
  ``clip_gradients`` (skipped when ``clip_grad`` is 0, as there), ``cancel_gradients_last_layer``, step.

Only the loss computation is passed in as a callable, so the same loss drives both loops.
"""

import numpy as np


def cosine_scheduler(base_value, final_value, epochs, niter_per_ep, warmup_epochs=0, start_warmup_value=0):
    warmup_schedule = np.array([])
    warmup_iters = warmup_epochs * niter_per_ep
    if warmup_epochs > 0:
        warmup_schedule = np.linspace(start_warmup_value, base_value, warmup_iters)

    iters = np.arange(epochs * niter_per_ep - warmup_iters)
    schedule = final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / len(iters)))

    schedule = np.concatenate((warmup_schedule, schedule))
    assert len(schedule) == epochs * niter_per_ep
    return schedule


def teacher_temp_schedule(warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs, nepochs):
    return np.concatenate(
        (
            np.linspace(warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs),
            np.ones(nepochs - warmup_teacher_temp_epochs) * teacher_temp,
        )
    )


def clip_gradients(model, clip):
    norms = []
    for name, p in model.named_parameters():  # noqa: B007 (verbatim)
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            norms.append(param_norm.item())
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)
    return norms


def cancel_gradients_last_layer(epoch, model, freeze_last_layer):
    if epoch >= freeze_last_layer:
        return
    for n, p in model.named_parameters():
        if "last_layer" in n:
            p.grad = None


def get_params_groups(model):
    regularized = []
    not_regularized = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        # we do not regularize biases nor Norm parameters
        if name.endswith(".bias") or len(param.shape) == 1:
            not_regularized.append(param)
        else:
            regularized.append(param)
    return [{"params": regularized}, {"params": not_regularized, "weight_decay": 0.0}]


def student_step(student, compute_loss, optimizer, lr_schedule, wd_schedule, it, epoch, clip_grad, freeze_last_layer):
    """``it``: the global training iteration (``len(data_loader) * epoch + it`` in DINO)."""
    for i, param_group in enumerate(optimizer.param_groups):
        param_group["lr"] = lr_schedule[it]
        if i == 0:  # only the first group is regularized
            param_group["weight_decay"] = wd_schedule[it]
    loss = compute_loss()
    optimizer.zero_grad()
    loss.backward()
    if clip_grad:
        clip_gradients(student, clip_grad)
    cancel_gradients_last_layer(epoch, student, freeze_last_layer)
    optimizer.step()
    return loss
