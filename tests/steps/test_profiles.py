from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from queues.steps.profiles import (
    DEFAULT_DIR,
    Profile,
    ProfileError,
    ProfileNotFound,
    all_profiles,
    load_profile,
)

GOOD = {
    "collection": "ark:/13030/m5x",
    "ark_shoulder": "ark:/99999/fk4",
    "contacts": ["a@example.org"],
    "storage_node": 9501,
}


def write(folder: Path, name: str, data: object) -> None:
    (folder / f"{name}.json").write_text(json.dumps(data) if not isinstance(data, str) else data)


def test_shipped_demo_profile_loads() -> None:
    profile = load_profile("merritt_demo_content", directory=DEFAULT_DIR)

    assert profile.ark_shoulder == "ark:/99999/fk4"
    assert profile.contacts == ("merritt-demo@example.org",)


def test_every_shipped_profile_is_valid() -> None:
    names = [p.name for p in all_profiles(directory=DEFAULT_DIR)]

    assert "merritt_demo_content" in names
    assert len(names) >= 2


def test_profile_defaults(tmp_path: Path) -> None:
    write(tmp_path, "p1", GOOD)

    assert load_profile("p1", directory=tmp_path) == Profile(
        name="p1",
        collection="ark:/13030/m5x",
        ark_shoulder="ark:/99999/fk4",
        contacts=("a@example.org",),
        storage_node="9501",
    )


def test_profiles_dir_comes_from_settings(tmp_path: Path, settings) -> None:
    write(tmp_path, "from_settings", GOOD)
    settings.MRT_PROFILES_DIR = tmp_path

    assert [p.name for p in all_profiles()] == ["from_settings"]


def test_missing_profile_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(ProfileNotFound, match="no profile named 'nope'"):
        load_profile("nope", directory=tmp_path)


@pytest.mark.parametrize("name", ["../etc/passwd", "a b", "", "x" * 101, ".."])
def test_unsafe_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ProfileError, match="invalid profile name"):
        load_profile(name, directory=tmp_path)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"priority": 100}, "priority must be a whole number 0..99"),
        ({"priority": True}, "priority must be"),
        ({"contacts": ["not-an-address"]}, "contacts must be a list of e-mail addresses"),
        ({"collection": "13030/m5x"}, "collection must be an ARK"),
        ({"ark_shoulder": "doi:10.5072/FK2"}, "ark_shoulder must look like"),
        ({"callback_url": "ftp://x"}, "callback_url must be an http(s) URL"),
        ({"storage_node": ""}, "storage_node must be a node id"),
        ({"queued_mail": "yes"}, "queued_mail must be true or false"),
    ],
)
def test_malformed_profiles_say_what_is_wrong(
    tmp_path: Path, change: dict[str, object], problem: str
) -> None:
    write(tmp_path, "bad", {**GOOD, **change})

    with pytest.raises(ProfileError) as raised:
        load_profile("bad", directory=tmp_path)

    assert str(raised.value).startswith("profile 'bad': ")
    assert problem in str(raised.value)


def test_missing_key_and_bad_json_are_profile_errors(tmp_path: Path) -> None:
    write(tmp_path, "short", {"collection": "ark:/1/x"})
    write(tmp_path, "broken", "{not json")

    with pytest.raises(ProfileError, match="missing 'ark_shoulder'"):
        load_profile("short", directory=tmp_path)
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile("broken", directory=tmp_path)


# Merritt's own ANVL profiles -------------------------------------------------------------------

# As Merritt's ingest profiles look (ProfileUtil reads them as Java properties).
MERRITT_PROFILE = """\
#*********************************************************************
#   Merritt ingest profile
#*********************************************************************
ProfileID: ucb_lib_letters
ProfileDescription: UC Berkeley Library letters
Identifier-scheme: ARK
Identifier-namespace: 13030
Collection.1: ark:/13030/m5letters
Collection.2: ark:/13030/m5ucblib
Type: MRT-curatorial
Role: MRT-content
Aggregate:
Owner: ark:/13030/j2ucblib
Notification.1: curator@example.org
Notification.2 = archivist@example.org
Context: ucb_lib
EZID_co-owner: merritt
# === START Handlers ===
HandlerQueue.1: org.cdlib.mrt.ingest.handlers.queue.HandlerDisaggregate
Handler.1: org.cdlib.mrt.ingest.handlers.initialize.HandlerInitialize
Handler.2: org.cdlib.mrt.ingest.handlers.process.HandlerMinter
StorageService: http://store.example.org:35121
StorageNode: 9501
CreationDate: 2010-01-19T13:28:14-08:00
ModificationDate: 2010-01-19T13:28:14-08:00
ObjectMinterURL: https://ezid.cdlib.org/shoulder/ark:/13030/m5
CallbackURL: https://callbacks.example.org/merritt
NotificationFormat: xml
Priority: 03
"""


def test_a_merritt_anvl_profile_is_read(tmp_path: Path) -> None:
    (tmp_path / "ucb_lib_letters.txt").write_text(MERRITT_PROFILE)

    profile = load_profile("ucb_lib_letters", directory=tmp_path)

    assert profile.source == "anvl"
    assert profile.collection == "ark:/13030/m5letters"
    assert profile.collections == ("ark:/13030/m5letters", "ark:/13030/m5ucblib")
    assert profile.ark_shoulder == "ark:/13030/m5"
    assert profile.contacts == ("curator@example.org", "archivist@example.org")
    assert profile.storage_node == "9501"
    assert profile.storage_service == "http://store.example.org:35121"
    assert profile.owner == "ark:/13030/j2ucblib"
    assert profile.callback_url == "https://callbacks.example.org/merritt"
    assert profile.priority == 3
    assert profile.notification_format == "xml"
    assert (profile.object_type, profile.object_role, profile.aggregate) == (
        "MRT-curatorial",
        "MRT-content",
        None,
    )
    assert profile.description == "UC Berkeley Library letters"
    # What a mint sends EZID as mrt.creator and _owner.
    assert (profile.context, profile.ezid_coowner) == ("ucb_lib", "merritt")


def test_a_merritt_profile_without_extension_is_read_and_listed(tmp_path: Path) -> None:
    (tmp_path / "ucb_lib_letters").write_text(MERRITT_PROFILE)
    (tmp_path / "README.txt").write_text("not a profile: it names no ProfileID\n")
    (tmp_path / "other.txt").write_text(MERRITT_PROFILE.replace("ucb_lib_letters", "other"))

    assert load_profile("ucb_lib_letters", directory=tmp_path).owner == "ark:/13030/j2ucblib"
    assert [p.name for p in all_profiles(directory=tmp_path)] == ["other"]


def test_a_json_profile_wins_over_a_text_one(tmp_path: Path) -> None:
    write(tmp_path, "both", GOOD)
    (tmp_path / "both.txt").write_text(MERRITT_PROFILE)

    assert load_profile("both", directory=tmp_path).source == "json"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("Collection.1: ark:/13030/m5letters\n", ""), None),  # Collection.2 is still there
        (
            ("ObjectMinterURL: https://ezid.cdlib.org/shoulder/ark:/13030/m5", "ObjectMinterURL:"),
            "shoulder",
        ),
        (("StorageNode: 9501", "StorageNode: nine"), "StorageNode"),
        (("Notification.1: curator@example.org", "Notification.1: curator"), "e-mail"),
        (("Priority: 03", "Priority: 100"), "Priority"),
        (("Owner: ark:/13030/j2ucblib", "Owner: someone"), "Owner"),
        (
            ("CallbackURL: https://callbacks.example.org/merritt", "CallbackURL: ftp://x"),
            "CallbackURL",
        ),
    ],
)
def test_merritt_profile_problems_are_named(
    tmp_path: Path, change: tuple[str, str], problem: str | None
) -> None:
    (tmp_path / "p.txt").write_text(MERRITT_PROFILE.replace(*change))
    if problem is None:
        assert load_profile("p", directory=tmp_path).collection == "ark:/13030/m5ucblib"
        return
    with pytest.raises(ProfileError, match=problem):
        load_profile("p", directory=tmp_path)


def test_a_merritt_profile_needs_a_collection(tmp_path: Path) -> None:
    text = "\n".join(line for line in MERRITT_PROFILE.splitlines() if "Collection" not in line)
    (tmp_path / "p.txt").write_text(text)
    with pytest.raises(ProfileError, match="Collection"):
        load_profile("p", directory=tmp_path)


def test_properties_text_is_read_as_java_reads_it() -> None:
    from queues.steps.profiles import parse_properties

    props = parse_properties("a: 1\nb=2\nc 3\n! note\n  d : four \\\n     five\ne:\nf\\:g: h\\tI\n")

    assert props == {"a": "1", "b": "2", "c": "3", "d": "four five", "e": "", "f:g": "h\tI"}


def _settled(path: Path, seconds_ago: float) -> None:
    stamp = time.time() - seconds_ago
    os.utime(path, (stamp, stamp))


@pytest.mark.quick
def test_a_settled_profile_is_read_once_and_read_again_when_its_file_changes(
    tmp_path: Path,
) -> None:
    write(tmp_path, "c", {**GOOD, "priority": 5})
    path = tmp_path / "c.json"
    _settled(path, 60)
    first = load_profile("c", directory=tmp_path)
    assert load_profile("c", directory=tmp_path) is first  # not read again
    # The same size, the same inode: only the modification time tells.
    path.write_text(json.dumps({**GOOD, "priority": 7}))
    _settled(path, 30)
    assert load_profile("c", directory=tmp_path).priority == 7
    # A text profile written later loses to the JSON one; the JSON one gone, the text one wins.
    (tmp_path / "c.txt").write_text(MERRITT_PROFILE)
    assert load_profile("c", directory=tmp_path).priority == 7
    path.unlink()
    assert load_profile("c", directory=tmp_path).collection == "ark:/13030/m5letters"


@pytest.mark.quick
def test_a_profile_written_just_now_is_read_again_each_time(tmp_path: Path) -> None:
    write(tmp_path, "c", {**GOOD, "priority": 5})
    first = load_profile("c", directory=tmp_path)
    assert load_profile("c", directory=tmp_path) is not first
    # Rewritten within the clock's grain, the same size: still seen.
    (tmp_path / "c.json").write_text(json.dumps({**GOOD, "priority": 6}))
    assert load_profile("c", directory=tmp_path).priority == 6
