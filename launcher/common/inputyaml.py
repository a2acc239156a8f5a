"""The one reader's part for YAML files (``--config``, ``--groups-file``): PyYAML, bounded.

Apart from :mod:`launcher.common.inputfiles` so that ``launcher status`` and ``launcher prestop``, which
read JSON only, never import PyYAML. The same bounds: regular files only, a size cap, strict UTF-8,
:data:`MAX_DEPTH` levels, numbers within :data:`MAX_NUMBER`; and no aliases.
"""

import os
from typing import Any

from launcher.common.inputfiles import (MAX_DEPTH, MAX_NUMBER, InputFileError, OutOfRange, brief, decode_text,
                                        read_bytes, value_problem)


def read_yaml(path: str, what: str, limit: int) -> Any:
    """The parsed YAML (or JSON) file ``path``, within :data:`MAX_DEPTH` levels and without aliases.

    Aliases are refused because one line of them can expand into billions of nodes for whatever
    walks the result.

    Raises:
        FileNotFoundError, OSError: as :func:`read_bytes`.
        InputFileError: not a regular file, too big, not UTF-8, not YAML (the parser's message on
            one line), nested too deep, with an alias, or with an integer too long to convert.
    """
    import yaml  # only paid for when a YAML file is read

    path = os.fspath(path)
    text = decode_text(read_bytes(path, what, limit), path, what)
    loader = None
    try:
        loader = _bounded_loader(yaml)(text)  # the reader refuses unprintable characters right here
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise InputFileError(what, path, f"is not valid YAML: {brief(exc)}") from None
    except InputFileError as exc:
        raise InputFileError(what, path, exc.problem) from None
    except OutOfRange as exc:
        raise InputFileError(what, path, str(exc)) from None
    except ValueError as exc:  # a constructor's int() or date() refused the value
        raise InputFileError(what, path, value_problem(text, exc)) from None
    finally:
        if loader is not None:
            loader.dispose()


_LOADER: Any = None


def _bounded_loader(yaml: Any) -> type:
    """``yaml.SafeLoader`` that refuses aliases and more than :data:`MAX_DEPTH` levels (built once)."""
    global _LOADER  # pylint: disable=global-statement
    if _LOADER is not None:
        return _LOADER

    class BoundedLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
        """Composing is the recursive step of PyYAML (the scanner and parser are not): bound it there."""

        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise InputFileError("", "", f"uses an alias (line {mark.line + 1}); aliases are not supported")
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    mark = self.peek_event().start_mark
                    raise InputFileError("", "", f"nests deeper than {MAX_DEPTH} levels (line {mark.line + 1})")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    def bounded(construct: Any) -> Any:
        def checked(loader: Any, node: Any) -> Any:
            value = construct(loader, node)
            if -MAX_NUMBER <= value <= MAX_NUMBER:  # False for .inf and .nan
                return value
            raise OutOfRange(str(node.value))
        return checked

    for tag in ("int", "float"):
        name = f"tag:yaml.org,2002:{tag}"
        BoundedLoader.add_constructor(name, bounded(yaml.SafeLoader.yaml_constructors[name]))
    _LOADER = BoundedLoader
    return _LOADER
