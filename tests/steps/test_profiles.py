from __future__ import annotations

import json
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
