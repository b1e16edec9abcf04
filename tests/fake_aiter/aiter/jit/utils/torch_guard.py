"""``torch_compile_guard`` stand-in: like aiter's, callers see a ``(*args, **kwargs)`` wrapper.

(The real one also registers ``torch.ops.aiter.<name>``; the fake does not.)
"""


def torch_compile_guard(mutates_args=(), device="cuda", calling_func_=None, gen_fake=None):
    def decorator(func):
        def outer_wrapper(*args, **kwargs):
            return func(*args, **kwargs)

        return outer_wrapper

    return decorator
