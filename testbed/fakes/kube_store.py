"""The fake's etcd: objects, one global resourceVersion, watch history and compaction.

Watches replay the history after their resourceVersion; below the compaction point they get 410.
Each write can be a dry run (DryRunnableStorage): checked and answered as it would be, with
nothing stored, no event and no new resourceVersion.
"""

from __future__ import annotations

import bisect
import copy
import random
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from testbed.fakes import kube_errors as errors
from testbed.fakes.kube_errors import FieldError, GroupResource, invalid_value, required_value
from testbed.fakes.kube_resources import ResourceRegistry, ResourceType
from testbed.fakes.kube_schema import format_time
from testbed.fakes.kube_selectors import (
    FieldRequirement,
    LabelRequirement,
    SelectorError,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)

JSONDict = dict[str, Any]

__all__ = ["ObjectStore", "StoreEvent", "object_fields", "sort_key"]

# names.SimpleNameGenerator: five characters from an alphabet without vowels or look-alikes.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MAX_GENERATED_PREFIX = 58


@dataclass(frozen=True)
class StoreEvent:
    """One write, as the watch cache keeps it (objects in storage form)."""

    type: str  # ADDED, MODIFIED or DELETED
    key: GroupResource
    namespace: str
    name: str
    object: JSONDict
    previous: JSONDict | None
    resource_version: int


def sort_key(namespace: str, name: str) -> str:
    """Where an object sits in a LIST (etcd's key order): `namespace/name`, or `name`."""
    return f"{namespace}/{name}" if namespace else name


def _namespace(resource_type: ResourceType, namespace: str | None) -> str:
    return (namespace or "default") if resource_type.namespaced else ""


def _lookup(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def object_fields(resource_type: ResourceType, obj: JSONDict) -> dict[str, str]:
    """The field set a fieldSelector matches against (GetAttrs of each registry)."""
    metadata = obj.get("metadata") or {}
    fields = {"metadata.name": metadata.get("name", "")}
    if resource_type.namespaced:
        fields["metadata.namespace"] = metadata.get("namespace", "")
    stored_paths = dict(resource_type.field_label_paths)
    for label in resource_type.field_labels:
        value = _lookup(obj, stored_paths.get(label, label))
        if isinstance(value, bool):
            fields[label] = "true" if value else "false"
        elif value is None:
            fields[label] = ""
        elif isinstance(value, dict) and label == "source":
            fields[label] = str(value.get("component", ""))
        else:
            fields[label] = str(value)
    return fields


def compile_selectors(resource_type: ResourceType, label_selector: str | None,
                      field_selector: str | None
                      ) -> tuple[tuple[LabelRequirement, ...], tuple[FieldRequirement, ...]]:
    """Parse both selectors, answering 400 as the apiserver does for bad ones."""
    try:
        labels = parse_label_selector(label_selector or "")
    except SelectorError as error:
        raise errors.bad_request(str(error)) from None
    try:
        fields = parse_field_selector(field_selector or "")
    except SelectorError as error:
        raise errors.bad_request(str(error)) from None
    known = {"metadata.name", "metadata.namespace", *resource_type.field_labels}
    for requirement in fields:
        if requirement.field not in known:
            if resource_type.builtin:
                raise errors.bad_request(f"field label not supported: {requirement.field}")
            raise errors.bad_request(f'"{requirement.field}" is not a known field selector: '
                                     'only "metadata.name", "metadata.namespace"')
    return labels, fields


def matches(resource_type: ResourceType, obj: JSONDict, labels: Sequence[LabelRequirement],
            fields: Sequence[FieldRequirement]) -> bool:
    object_labels = (obj.get("metadata") or {}).get("labels") or {}
    if not labels_match(labels, object_labels):
        return False
    if fields:
        have = object_fields(resource_type, obj)
        return all(f.matches(have) for f in fields)
    return True


def _spec_view(resource_type: ResourceType, obj: JSONDict) -> Any:
    """What a generation bump compares, per the kind's strategy."""
    if resource_type.generation == "spec":
        return obj.get("spec")
    if resource_type.generation == "spec+annotations":
        return obj.get("spec"), (obj.get("metadata") or {}).get("annotations")
    skip = {"metadata", "apiVersion", "kind"}
    if any(v.status for v in resource_type.versions.values()):
        skip.add("status")
    return {k: v for k, v in obj.items() if k not in skip}


class ObjectStore:
    """Objects in storage form. Versioned helpers (create/get/...) serve test set-up."""

    def __init__(self, registry: ResourceRegistry, *, clock: Callable[[], datetime],
                 first_resource_version: int = 1000) -> None:
        self.registry = registry
        self._clock = clock
        self._resource_version = first_resource_version
        self._compacted = 0
        self._objects: dict[GroupResource, dict[tuple[str, str], JSONDict]] = {}
        # Sorted keys per bucket for LISTs; dropped whenever a key is added or removed.
        self._order: dict[GroupResource, list[tuple[str, tuple[str, str]]]] = {}
        self._history: list[StoreEvent] = []
        self._history_versions: list[int] = []
        self._subscribers: list[Callable[[StoreEvent], None]] = []
        self._random = random.Random()

    # --- resource versions, history, subscribers --------------------------------------------

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out (etcd's current revision)."""
        return self._resource_version

    @property
    def compacted_resource_version(self) -> int:
        """Watches from a resourceVersion below this get 410 Expired."""
        return self._compacted

    def compact(self, to_resource_version: int | None = None) -> int:
        """Forget history up to `to_resource_version` (default: everything so far)."""
        target = self._resource_version if to_resource_version is None else to_resource_version
        target = min(max(target, self._compacted), self._resource_version)
        self._compacted = target
        cut = bisect.bisect_right(self._history_versions, target)
        del self._history[:cut]
        del self._history_versions[:cut]
        return target

    def history_after(self, resource_version: int) -> list[StoreEvent]:
        start = bisect.bisect_right(self._history_versions, resource_version)
        return self._history[start:]

    def subscribe(self, callback: Callable[[StoreEvent], None]) -> Callable[[], None]:
        """Call `callback` synchronously after every write; returns the unsubscribe function."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)
        return unsubscribe

    def _record(self, event: StoreEvent) -> None:
        self._history.append(event)
        self._history_versions.append(event.resource_version)
        for callback in list(self._subscribers):
            callback(event)

    def _next_resource_version(self) -> int:
        self._resource_version += 1
        return self._resource_version

    # --- storage-level operations (objects in storage form) ---------------------------------

    def bucket(self, key: GroupResource) -> dict[tuple[str, str], JSONDict]:
        return self._objects.setdefault(key, {})

    def lookup(self, resource_type: ResourceType, namespace: str, name: str) -> JSONDict | None:
        found = self.bucket(resource_type.storage_key).get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def require(self, resource_type: ResourceType, namespace: str, name: str,
                gr: GroupResource | None = None) -> JSONDict:
        found = self.lookup(resource_type, namespace, name)
        if found is None:
            raise errors.not_found(gr or resource_type.group_resource, name)
        return found

    def _ordered(self, key: GroupResource) -> list[tuple[str, tuple[str, str]]]:
        """The bucket's keys by sort key, kept until an object is added or removed."""
        order = self._order.get(key)
        if order is None:
            order = sorted((sort_key(namespace, name), (namespace, name))
                           for namespace, name in self.bucket(key))
            self._order[key] = order
        return order

    def entries(self, resource_type: ResourceType, namespace: str | None, *,
                start: str = "") -> Iterator[tuple[str, JSONDict]]:
        """(sort key, stored object) in etcd's key order (`namespace/name`), from `start` on.

        The objects are the stored ones, not copies: callers read them and copy what they hand
        out. A paged LIST thereby costs its page, not the whole collection.
        """
        key = resource_type.storage_key
        bucket = self.bucket(key)
        order = self._ordered(key)
        prefix = f"{namespace}/" if namespace else ""
        begin = max(start, prefix)
        index = bisect.bisect_left(order, (begin,)) if begin else 0
        for position in range(index, len(order)):
            item_key, stored_key = order[position]
            if prefix and not item_key.startswith(prefix):
                return  # a namespace's keys are contiguous: past them, nothing more of it
            if namespace is not None and stored_key[0] != namespace:
                continue
            obj = bucket.get(stored_key)
            if obj is not None:  # None: removed while the caller was iterating
                yield item_key, obj

    def entries_at(self, resource_type: ResourceType, namespace: str | None, *,
                   resource_version: int, start: str = "") -> Iterator[tuple[str, JSONDict]]:
        """`entries` as they were at `resource_version` (etcd's snapshot read at a revision):
        the writes after it are undone from the history. The caller checks that the revision
        is not compacted."""
        later = [event for event in self.history_after(resource_version)
                 if event.key == resource_type.storage_key]
        if not later:
            yield from self.entries(resource_type, namespace, start=start)
            return
        snapshot = dict(self.bucket(resource_type.storage_key))
        for event in reversed(later):
            where = (event.namespace, event.name)
            if event.type == "ADDED":
                snapshot.pop(where, None)
            elif event.previous is not None:
                snapshot[where] = event.previous
        order = sorted((sort_key(*where), where) for where in snapshot)
        for item_key, where in order:
            if item_key < start or (namespace is not None and where[0] != namespace):
                continue
            yield item_key, snapshot[where]

    def items(self, resource_type: ResourceType, namespace: str | None) -> Iterator[JSONDict]:
        """Copies of the objects (of one namespace, or all), in key order."""
        for _, obj in self.entries(resource_type, namespace):
            yield copy.deepcopy(obj)

    def generate_name(self, prefix: str) -> str:
        suffix = "".join(self._random.choice(_NAME_ALPHABET) for _ in range(5))
        return prefix[:_MAX_GENERATED_PREFIX] + suffix

    def insert(self, resource_type: ResourceType, obj: JSONDict, *,
               gr: GroupResource | None = None, dry_run: bool = False) -> JSONDict:
        """Create: fills uid, resourceVersion, creationTimestamp, generation; 409 if present.
        A dry run answers the object without a resourceVersion (none was handed out)."""
        obj = copy.deepcopy(obj)
        metadata = obj.setdefault("metadata", {})
        name = metadata.get("name") or ""
        if not name and metadata.get("generateName"):
            name = self.generate_name(metadata["generateName"])
            metadata["name"] = name
        if not name:
            raise errors.invalid(resource_type.group_kind, "",
                                 [required_value("metadata.name",
                                                 "name or generateName is required")])
        namespace = metadata.get("namespace", "") if resource_type.namespaced else ""
        if not resource_type.namespaced:
            metadata.pop("namespace", None)
        bucket = self.bucket(resource_type.storage_key)
        if (namespace, name) in bucket:
            raise errors.already_exists(gr or resource_type.group_resource, name)
        resource_version = 0 if dry_run else self._next_resource_version()
        metadata["uid"] = str(uuid.uuid4())
        if dry_run:
            metadata.pop("resourceVersion", None)
        else:
            metadata["resourceVersion"] = str(resource_version)
        metadata["creationTimestamp"] = format_time(self._clock())
        metadata.pop("deletionTimestamp", None)
        if resource_type.generation != "none":
            metadata["generation"] = 1
        else:
            metadata.pop("generation", None)
        if dry_run:
            return obj
        bucket[(namespace, name)] = obj
        self._order.pop(resource_type.storage_key, None)
        self._record(StoreEvent("ADDED", resource_type.storage_key, namespace, name,
                                copy.deepcopy(obj), None, resource_version))
        return copy.deepcopy(obj)

    def replace(self, resource_type: ResourceType, obj: JSONDict, *,
                gr: GroupResource | None = None, dry_run: bool = False) -> JSONDict:
        """Update. A resourceVersion in `obj` is a precondition (409 when stale). A dry run
        answers the updated object at the old resourceVersion."""
        obj = copy.deepcopy(obj)
        metadata = obj.setdefault("metadata", {})
        name = metadata.get("name", "")
        namespace = metadata.get("namespace", "") if resource_type.namespaced else ""
        gr = gr or resource_type.group_resource
        bucket = self.bucket(resource_type.storage_key)
        old = bucket.get((namespace, name))
        if old is None:
            raise errors.not_found(gr, name)
        old_metadata = old["metadata"]
        wanted = metadata.get("resourceVersion")
        if wanted and wanted != old_metadata["resourceVersion"]:
            raise errors.conflict(gr, name)
        problems = self._immutable_metadata(metadata, old_metadata)
        if problems:
            raise errors.invalid(resource_type.group_kind, name, problems)
        metadata["uid"] = old_metadata["uid"]
        metadata["creationTimestamp"] = old_metadata["creationTimestamp"]
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            if key in old_metadata:
                metadata[key] = old_metadata[key]
            else:
                metadata.pop(key, None)
        if resource_type.generation != "none":
            generation = int(old_metadata.get("generation", 1))
            if _spec_view(resource_type, obj) != _spec_view(resource_type, old):
                generation += 1
            metadata["generation"] = generation
        else:
            metadata.pop("generation", None)
        metadata["resourceVersion"] = old_metadata["resourceVersion"]
        if obj == old:
            return copy.deepcopy(old)  # a no-op update writes nothing and keeps the RV
        if dry_run:
            return obj
        resource_version = self._next_resource_version()
        metadata["resourceVersion"] = str(resource_version)
        if metadata.get("deletionTimestamp") and not metadata.get("finalizers"):
            del bucket[(namespace, name)]
            self._order.pop(resource_type.storage_key, None)
            self._record(StoreEvent("DELETED", resource_type.storage_key, namespace, name,
                                    copy.deepcopy(obj), copy.deepcopy(old), resource_version))
            return copy.deepcopy(obj)
        bucket[(namespace, name)] = obj
        self._record(StoreEvent("MODIFIED", resource_type.storage_key, namespace, name,
                                copy.deepcopy(obj), copy.deepcopy(old), resource_version))
        return copy.deepcopy(obj)

    @staticmethod
    def _immutable_metadata(new: JSONDict, old: JSONDict) -> list[FieldError]:
        problems = []
        uid = new.get("uid")
        if uid and uid != old["uid"]:
            problems.append(invalid_value("metadata.uid", uid, "field is immutable"))
        return problems

    def remove(self, resource_type: ResourceType, namespace: str, name: str, *,
               gr: GroupResource | None = None, precondition_uid: str | None = None,
               precondition_resource_version: str | None = None,
               dry_run: bool = False) -> tuple[JSONDict, bool]:
        """Delete; returns (object, deleted_now). With finalizers it only marks deletion. A dry
        run answers the same, at the old resourceVersion, and removes or marks nothing."""
        gr = gr or resource_type.group_resource
        bucket = self.bucket(resource_type.storage_key)
        old = bucket.get((namespace, name))
        if old is None:
            raise errors.not_found(gr, name)
        metadata = old["metadata"]
        if precondition_uid and precondition_uid != metadata["uid"]:
            raise errors.conflict(gr, name, f"Precondition failed: UID in precondition: "
                                            f"{precondition_uid}, UID in object meta: "
                                            f"{metadata['uid']}")
        if precondition_resource_version and precondition_resource_version != \
                metadata["resourceVersion"]:
            raise errors.conflict(gr, name, "Precondition failed: ResourceVersion in "
                                            f"precondition: {precondition_resource_version}, "
                                            "ResourceVersion in object meta: "
                                            f"{metadata['resourceVersion']}")
        obj = copy.deepcopy(old)
        if dry_run:
            if metadata.get("finalizers") and not metadata.get("deletionTimestamp"):
                self._mark_deleting(obj)
            return obj, not metadata.get("finalizers")
        resource_version = self._next_resource_version()
        if metadata.get("finalizers"):
            if not metadata.get("deletionTimestamp"):
                self._mark_deleting(obj)
                obj["metadata"]["resourceVersion"] = str(resource_version)
                bucket[(namespace, name)] = obj
                self._record(StoreEvent("MODIFIED", resource_type.storage_key, namespace, name,
                                        copy.deepcopy(obj), copy.deepcopy(old),
                                        resource_version))
            else:
                self._resource_version -= 1  # nothing written
            return copy.deepcopy(bucket[(namespace, name)]), False
        obj["metadata"]["resourceVersion"] = str(resource_version)
        del bucket[(namespace, name)]
        self._order.pop(resource_type.storage_key, None)
        self._record(StoreEvent("DELETED", resource_type.storage_key, namespace, name,
                                copy.deepcopy(obj), copy.deepcopy(old), resource_version))
        return obj, True

    def _mark_deleting(self, obj: JSONDict) -> None:
        metadata = obj["metadata"]
        metadata["deletionTimestamp"] = format_time(self._clock())
        metadata["deletionGracePeriodSeconds"] = 0
        # registry/store.go markAsDeleting: the first deletion mark is a change the object's
        # controllers must see, so a tracked generation goes up.
        generation = metadata.get("generation")
        if isinstance(generation, int) and generation > 0:
            metadata["generation"] = generation + 1

    # --- versioned helpers for tests (bypass HTTP: no admission, status kept as given) -------

    def _type(self, group: str, version: str, resource: str) -> ResourceType:
        resource_type = self.registry.resolve(group, version, resource)
        if resource_type is None:
            raise KeyError(f"the fake does not serve {resource} in {group or 'core'}/{version}")
        return resource_type

    def create(self, group: str, version: str, resource: str, obj: JSONDict, *,
               namespace: str | None = None) -> JSONDict:
        """Store `obj` (in `version`) as is, status included; returns it as stored."""
        resource_type = self._type(group, version, resource)
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", resource_type.api_version(version))
        obj.setdefault("kind", resource_type.kind)
        if namespace is not None:
            obj.setdefault("metadata", {})["namespace"] = namespace
        if resource_type.namespaced and not (obj.get("metadata") or {}).get("namespace"):
            obj.setdefault("metadata", {})["namespace"] = "default"
        stored = self.insert(resource_type, resource_type.convert_from(obj, version))
        return resource_type.convert_to(stored, version)

    def get(self, group: str, version: str, resource: str, name: str, *,
            namespace: str | None = None) -> JSONDict:
        resource_type = self._type(group, version, resource)
        stored = self.require(resource_type, _namespace(resource_type, namespace),
                              name)
        return resource_type.convert_to(stored, version)

    def try_get(self, group: str, version: str, resource: str, name: str, *,
                namespace: str | None = None) -> JSONDict | None:
        resource_type = self._type(group, version, resource)
        stored = self.lookup(resource_type, _namespace(resource_type, namespace),
                             name)
        return None if stored is None else resource_type.convert_to(stored, version)

    def list(self, group: str, version: str, resource: str, *, namespace: str | None = None,
             label_selector: str | None = None, field_selector: str | None = None
             ) -> list[JSONDict]:
        resource_type = self._type(group, version, resource)
        labels, fields = compile_selectors(resource_type, label_selector, field_selector)
        return [resource_type.convert_to(obj, version)
                for obj in self.items(resource_type, namespace)
                if matches(resource_type, obj, labels, fields)]

    def update(self, group: str, version: str, resource: str, obj: JSONDict) -> JSONDict:
        """Replace the whole object (status included); a resourceVersion in it must be current."""
        resource_type = self._type(group, version, resource)
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", resource_type.api_version(version))
        obj.setdefault("kind", resource_type.kind)
        if resource_type.namespaced and not (obj.get("metadata") or {}).get("namespace"):
            obj.setdefault("metadata", {})["namespace"] = "default"
        stored = self.replace(resource_type, resource_type.convert_from(obj, version))
        return resource_type.convert_to(stored, version)

    def mutate(self, group: str, version: str, resource: str, name: str,
               change: Callable[[JSONDict], None], *, namespace: str | None = None) -> JSONDict:
        """Read, apply `change` in place, write back (no conflict possible)."""
        obj = self.get(group, version, resource, name, namespace=namespace)
        change(obj)
        obj["metadata"].pop("resourceVersion", None)
        return self.update(group, version, resource, obj)

    def delete(self, group: str, version: str, resource: str, name: str, *,
               namespace: str | None = None) -> JSONDict:
        resource_type = self._type(group, version, resource)
        obj, _ = self.remove(resource_type,
                             _namespace(resource_type, namespace), name)
        return resource_type.convert_to(obj, version)
