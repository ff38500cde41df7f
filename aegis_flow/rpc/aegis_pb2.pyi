from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SyncWorkerCredsRequest(_message.Message):
    __slots__ = ("job", "namespace", "worker", "public_key", "bootstrap_token")
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job: str
    namespace: str
    worker: str
    public_key: str
    bootstrap_token: str
    def __init__(self, job: _Optional[str] = ..., namespace: _Optional[str] = ..., worker: _Optional[str] = ..., public_key: _Optional[str] = ..., bootstrap_token: _Optional[str] = ...) -> None: ...

class SyncWorkerCredsResponse(_message.Message):
    __slots__ = ("user_jwt", "nats_urls", "publish", "subscribe", "inbox_prefix", "renew_subject", "expires_at")
    USER_JWT_FIELD_NUMBER: _ClassVar[int]
    NATS_URLS_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    INBOX_PREFIX_FIELD_NUMBER: _ClassVar[int]
    RENEW_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    user_jwt: str
    nats_urls: _containers.RepeatedScalarFieldContainer[str]
    publish: _containers.RepeatedScalarFieldContainer[str]
    subscribe: _containers.RepeatedScalarFieldContainer[str]
    inbox_prefix: str
    renew_subject: str
    expires_at: int
    def __init__(self, user_jwt: _Optional[str] = ..., nats_urls: _Optional[_Iterable[str]] = ..., publish: _Optional[_Iterable[str]] = ..., subscribe: _Optional[_Iterable[str]] = ..., inbox_prefix: _Optional[str] = ..., renew_subject: _Optional[str] = ..., expires_at: _Optional[int] = ...) -> None: ...
