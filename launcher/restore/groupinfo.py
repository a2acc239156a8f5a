"""Read MindSpore's ``group_info.pb`` (a ``mindspore.straspb.ParallelGroupMap``) without MindSpore.

The message definition lives in ``schemas/group_info.proto``. Rather than committing ``protoc``
output (whose generated code is tied to a protobuf runtime range), the ``.proto`` is parsed here into a
``FileDescriptorProto`` and the message classes are built at runtime, so the ``.proto`` stays the single
source of truth and any protobuf >= 4.21 works. The parser accepts only the subset that file uses;
``tests/unit/restore/test_groupinfo.py`` checks the result against ``protoc``'s own descriptor.
"""

import re
from functools import lru_cache
from typing import List, Tuple

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from launcher.common.resources import schema_path

PROTO_FILE = "group_info.proto"
MESSAGE_NAME = "ParallelGroupMap"

_FDP = descriptor_pb2.FieldDescriptorProto
_SCALAR_TYPES = {
    "double": _FDP.TYPE_DOUBLE, "float": _FDP.TYPE_FLOAT, "int64": _FDP.TYPE_INT64,
    "uint64": _FDP.TYPE_UINT64, "int32": _FDP.TYPE_INT32, "fixed64": _FDP.TYPE_FIXED64,
    "fixed32": _FDP.TYPE_FIXED32, "bool": _FDP.TYPE_BOOL, "string": _FDP.TYPE_STRING,
    "bytes": _FDP.TYPE_BYTES, "uint32": _FDP.TYPE_UINT32, "sfixed32": _FDP.TYPE_SFIXED32,
    "sfixed64": _FDP.TYPE_SFIXED64, "sint32": _FDP.TYPE_SINT32, "sint64": _FDP.TYPE_SINT64,
}
_LABELS = {"required": _FDP.LABEL_REQUIRED, "optional": _FDP.LABEL_OPTIONAL,
           "repeated": _FDP.LABEL_REPEATED}
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_TOKEN = re.compile(r'[A-Za-z_][\w.]*|\d+|"[^"]*"|[{}=;]|\S')
_PUNCTUATION = "{}=;"


class ProtoSyntaxError(ValueError):
    """The shipped .proto uses a construct this minimal parser does not understand."""


def _tokens(text: str) -> List[str]:
    tokens = _TOKEN.findall(_COMMENT.sub(" ", text))
    for token in tokens:
        # The catch-all `\S` alternative yields single characters no other alternative accepts.
        if len(token) == 1 and token not in _PUNCTUATION and not (token.isalnum() or token == "_"):
            raise ProtoSyntaxError(f"unexpected character {token!r}")
    return tokens


def _json_name(name: str) -> str:
    """protoc's default JSON name: lowerCamelCase of the field name."""
    parts = name.split("_")
    return parts[0] + "".join(part[:1].upper() + part[1:] for part in parts[1:])


class _Parser:
    """Recursive-descent parser for: syntax, package, and flat messages of labelled fields."""

    def __init__(self, tokens: List[str]):
        self.tokens = tokens
        self.pos = 0

    def take(self, expected: str = "") -> str:
        if self.pos >= len(self.tokens):
            raise ProtoSyntaxError(f"unexpected end of file, expected {expected or 'a token'}")
        token = self.tokens[self.pos]
        if expected and token != expected:
            raise ProtoSyntaxError(f"expected {expected!r}, found {token!r}")
        self.pos += 1
        return token

    def parse(self, file_name: str) -> descriptor_pb2.FileDescriptorProto:
        fdp = descriptor_pb2.FileDescriptorProto(name=file_name)
        while self.pos < len(self.tokens):
            keyword = self.take()
            if keyword == "syntax":
                self.take("=")
                syntax = self.take().strip('"')
                if syntax != "proto2":
                    raise ProtoSyntaxError(f"only proto2 is supported, not {syntax}")
                self.take(";")
            elif keyword == "package":
                fdp.package = self.take()
                self.take(";")
            elif keyword == "message":
                self._message(fdp)
            else:
                raise ProtoSyntaxError(f"unsupported top-level statement {keyword!r}")
        return fdp

    def _message(self, fdp: descriptor_pb2.FileDescriptorProto) -> None:
        message = fdp.message_type.add(name=self.take())
        self.take("{")
        while self.tokens[self.pos:self.pos + 1] != ["}"]:
            label = self.take()
            if label not in _LABELS:
                raise ProtoSyntaxError(f"unsupported field label {label!r} in {message.name}")
            type_name, name = self.take(), self.take()
            self.take("=")
            field = message.field.add(name=name, number=int(self.take()), label=_LABELS[label],
                                      json_name=_json_name(name))
            if type_name in _SCALAR_TYPES:
                field.type = _SCALAR_TYPES[type_name]
            else:
                # Message types are resolved within the file's package (no imports, no nesting).
                field.type = _FDP.TYPE_MESSAGE
                field.type_name = f".{fdp.package}.{type_name}" if fdp.package else f".{type_name}"
            self.take(";")
        self.take("}")


def file_descriptor_proto() -> descriptor_pb2.FileDescriptorProto:
    """The ``FileDescriptorProto`` of ``schemas/group_info.proto``, as protoc would produce it."""
    text = schema_path(PROTO_FILE).read_text(encoding="utf-8")
    return _Parser(_tokens(text)).parse(PROTO_FILE)


@lru_cache(maxsize=None)
def parallel_group_map_class() -> type:
    """The ``ParallelGroupMap`` message class, built once from the .proto.

    A private pool keeps the launcher's copy from clashing with MindSpore's own registration of the
    same names when both live in one process.
    """
    fdp = file_descriptor_proto()
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(fdp.SerializeToString())
    descriptor = pool.FindMessageTypeByName(f"{fdp.package}.{MESSAGE_NAME}")
    get_class = getattr(message_factory, "GetMessageClass", None)
    if get_class is not None:
        return get_class(descriptor)
    # protobuf 4.21 predates GetMessageClass.
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


def parse_restore_rank_list(data: bytes) -> Tuple[int, ...]:
    """The ``ckpt_restore_rank_list`` of one ``group_info.pb``.

    Args:
        data: the file's bytes.

    Returns:
        The ranks, in file order.

    Raises:
        ValueError: the bytes are not a complete ``ParallelGroupMap`` (truncated, empty, corrupt, or
            the required restore list is missing or empty).
    """
    message: Message = parallel_group_map_class()()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise ValueError(f"not a valid ParallelGroupMap ({exc})") from exc
    # ParseFromString does not enforce proto2 `required`; a file cut short between fields parses
    # cleanly but lacks ckpt_restore_rank_list, which is written last.
    if not message.IsInitialized():
        missing = ", ".join(message.FindInitializationErrors())
        raise ValueError(f"incomplete ParallelGroupMap (missing {missing}); truncated?")
    ranks = tuple(message.ckpt_restore_rank_list.dim)
    if not ranks:
        raise ValueError("ParallelGroupMap has an empty ckpt_restore_rank_list")
    return ranks
