"""``Record``: a small stand-in for ``@dataclass`` on the classes `nsqcli pub` loads.

Importing ``dataclasses`` imports ``inspect`` (with ``ast``, ``dis``, ``tokenize``), and each
``@dataclass`` compiles generated code when its class is created: together ~15 ms of the
~40 ms that `nsqcli pub` may take from exec to exit on a slow machine. A Record gives what
those classes used of a dataclass, with the same behaviour:

- keyword or positional ``__init__`` in field order, defaults, ``field(default_factory=...)``,
  a missing or unknown argument is a TypeError;
- ``==`` over the fields (``field(compare=False)`` left out), ``repr`` (``repr=False`` left out);
- ``frozen=True``: assigning raises :class:`FrozenInstanceError` (an AttributeError, as the
  dataclass one is) and instances hash by their compared fields; otherwise not hashable;
- ``replace(**changes)``: a copy with some fields changed (``dataclasses.replace``).

Fields are the class's annotations, base classes' first."""

from __future__ import annotations

_MISSING = object()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen Record."""


class Field:
    __slots__ = ("default", "default_factory", "compare", "repr")

    def __init__(self, default=_MISSING, default_factory=None, compare: bool = True, repr: bool = True):
        self.default, self.default_factory, self.compare, self.repr = default, default_factory, compare, repr


def field(*, default=_MISSING, default_factory=None, compare: bool = True, repr: bool = True) -> Field:
    """Like ``dataclasses.field`` (the options used here)."""
    return Field(default, default_factory, compare, repr)


class Record:
    #: (name, Field) in order, set per subclass
    _fields: tuple = ()
    _frozen: bool = False

    def __init_subclass__(cls, frozen: bool = False, **kwargs):
        super().__init_subclass__(**kwargs)
        fields = dict(cls._fields)
        for name in cls.__dict__.get("__annotations__", {}):
            value = cls.__dict__.get(name, _MISSING)
            f = value if isinstance(value, Field) else Field(default=value)
            if isinstance(value, Field):
                if f.default is _MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, f.default)
            fields.pop(name, None)
            fields[name] = f
        cls._fields = tuple(fields.items())
        cls._frozen = frozen or cls._frozen
        if not cls._frozen:
            cls.__hash__ = None  # mutable and compared by value: not hashable (as a dataclass)

    def __init__(self, *args, **kwargs):
        fields = self._fields
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__}() takes {len(fields)} arguments but {len(args)} were given")
        for (name, _), value in zip(fields, args):
            if name in kwargs:
                raise TypeError(f"{type(self).__name__}() got multiple values for argument {name!r}")
            kwargs[name] = value
        put = object.__setattr__
        for name, f in fields:
            if name in kwargs:
                put(self, name, kwargs.pop(name))
            elif f.default_factory is not None:
                put(self, name, f.default_factory())
            elif f.default is not _MISSING:
                put(self, name, f.default)
            else:
                raise TypeError(f"{type(self).__name__}() missing required argument: {name!r}")
        if kwargs:
            raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {next(iter(kwargs))!r}")

    def __setattr__(self, name, value):
        if self._frozen:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        if self._frozen:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        object.__delattr__(self, name)

    def _key(self) -> tuple:
        return tuple(getattr(self, name) for name, f in self._fields if f.compare)

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name, f in self._fields if f.repr)
        return f"{type(self).__qualname__}({inner})"

    def replace(self, **changes):
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        values = {name: getattr(self, name) for name, _ in self._fields}
        values.update(changes)
        return type(self)(**values)
