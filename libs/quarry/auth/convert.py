"""IAM records (quarry.storage.v1) to the API's messages (quarry.v1.Auth), and the encoded
size of each as one element of a listing page (quarry.paging), so the IAM store cuts its
pages by the bytes the servicer will send."""

from __future__ import annotations

from google.protobuf.message import Message

from quarry.auth.policy import flat_statements, parse_policy
from quarry.paging import ELEMENT_OVERHEAD_BYTES
from quarry.storage.v1 import auth_records_pb2 as records
from quarry.v1 import auth_pb2 as pb


def user_to_proto(record: records.UserRecord) -> pb.User:
    return pb.User(id=record.id, created_at=record.created_at, email=record.email)


def group_to_proto(record: records.GroupRecord) -> pb.Group:
    return pb.Group(id=record.id, created_at=record.created_at, description=record.description)


def policy_to_proto(record: records.PolicyRecord) -> pb.Policy:
    statements = flat_statements(parse_policy(record.id, record.document))
    return pb.Policy(
        id=record.id,
        created_at=record.created_at,
        document=record.document,
        statements=[
            pb.PolicyStatement(effect=s.effect, actions=s.actions, resource=s.resource)
            for s in statements
        ],
    )


def credentials_to_proto(record: records.CredentialRecord) -> pb.Credentials:
    # Never the hash: only the key id, its owner and when it was made.
    return pb.Credentials(
        access_key_id=record.access_key_id, user_id=record.user_id, created_at=record.created_at
    )


_TO_PROTO = {
    records.UserRecord: user_to_proto,
    records.GroupRecord: group_to_proto,
    records.PolicyRecord: policy_to_proto,
    records.CredentialRecord: credentials_to_proto,
}


def to_proto(record: Message) -> Message:
    return _TO_PROTO[type(record)](record)  # type: ignore[operator]


def encoded_size(record: Message) -> int:
    """The bytes `record` adds to a listing response: its API message, as sent, plus the
    repeated field's element overhead (quarry.paging.encoded_size for IAM records)."""
    return to_proto(record).ByteSize() + ELEMENT_OVERHEAD_BYTES


__all__ = [
    "credentials_to_proto",
    "encoded_size",
    "group_to_proto",
    "policy_to_proto",
    "to_proto",
    "user_to_proto",
]
