"""A lazy NumPy result: an ndarray subclass that holds the inputs and an empty buffer, and runs
the matmul only when something reads its layout (``strides``) or asks NumPy for its values as a
plain array (``__array_function__``, ``__array__``, ``reshape``, ``copy``): the harness describes
the output that way after the call's clock has stopped.

Expected to be stopped by: outputs written into the judge's buffers inside the timed call, exact
types (the data path); the time from outside the candidate (the outside figure).
"""

import numpy as np

CHEAT = True


class Lazy(np.ndarray):
    def force(self):
        thunk = self.__dict__.pop("thunk", None) if hasattr(self, "__dict__") else None
        plain = self.view(np.ndarray)
        if thunk is not None:
            np.copyto(plain, thunk())
        return plain

    @property
    def strides(self):  # read when the output is described for the judge
        return np.ndarray.strides.__get__(self.force())

    def __array_function__(self, func, types, args, kwargs):
        args = tuple(a.force() if isinstance(a, Lazy) else a for a in args)
        return func(*args, **kwargs)

    def reshape(self, *shape, **kw):
        return self.force().reshape(*shape, **kw)

    def copy(self, *a, **kw):
        return self.force().copy(*a, **kw)

    def __array__(self, dtype=None, copy=None):
        out = self.force()
        return out if dtype is None else out.astype(dtype)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs = tuple(i.force() if isinstance(i, Lazy) else i for i in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)


def custom_kernel(data):
    a, b = data
    if CHEAT:
        out = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype).view(Lazy)
        out.thunk = lambda: np.tanh(a @ b)  # the shared inputs, read when the reply is encoded
        return out
    return np.tanh(np.matmul(a, b))
