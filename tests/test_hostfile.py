"""Hostfile and inline ``-H`` parsing: accepted forms, and exact error locations."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtlaunch.errors import ConfigError, HostfileError
from dtlaunch.hostfile import HostSpec, load_hosts, parse_hostfile, parse_inline
from dtlaunch.hostselect import select_hosts

REPO = Path(__file__).resolve().parent.parent


def _one(line: str) -> HostSpec:
    hosts = parse_hostfile(line + "\n", "h")
    assert len(hosts) == 1
    return hosts[0]


def _problems(text: str, filename: str = "h") -> list[str]:
    with pytest.raises(HostfileError) as info:
        parse_hostfile(text, filename)
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


def _inline_problems(spec: str) -> list[str]:
    with pytest.raises(HostfileError) as info:
        parse_inline(spec)
    return info.value.problems


# ------------------------------------------------------------------ good lines

GOOD_LINES = [
    ("node1", dict(label="node1", hostname="node1", slots=1, servers=0)),
    ("node1 slots=4", dict(label="node1", hostname="node1", slots=4)),
    ("node1\tslots=4", dict(label="node1", slots=4)),
    ("  node1   slots=4   ", dict(label="node1", slots=4)),
    (
        "deploy@node2:2222 slots=2 servers=1",
        dict(label="node2:2222", hostname="node2", user="deploy", port=2222, slots=2, servers=1),
    ),
    ("node3 slots=4 spare", dict(label="node3", slots=4, spare=True)),
    ("node3 spare slots=4", dict(label="node3", slots=4, spare=True)),
    ("node4 slots=2 class=v100", dict(label="node4", slots=2, device_class="v100")),
    ("node4 class=a100-80gb", dict(device_class="a100-80gb")),
    ("node5 slots=4 gpus=4", dict(label="node5", slots=4, gpus=4)),
    ("node6 slots=4 cpus=16 mem=64G", dict(cpus=16.0, memory_bytes=64 << 30)),
    ("node6 cpus=7.5 mem=1.5gib", dict(cpus=7.5, memory_bytes=3 << 29)),
    ("node6 mem=536870912", dict(memory_bytes=512 << 20)),
    ("node1 slots=4 # trailing comment", dict(label="node1", slots=4)),
    ("node1 slots=4#comment without space", dict(label="node1", slots=4)),
    ("10.0.0.1", dict(label="10.0.0.1", hostname="10.0.0.1")),
    ("10.0.0.1:22", dict(label="10.0.0.1:22", hostname="10.0.0.1", port=22)),
    ("root@127.0.0.2:65535", dict(user="root", hostname="127.0.0.2", port=65535)),
    ("[::1]", dict(label="::1", hostname="::1")),
    ("[::1]:2222 slots=3", dict(label="[::1]:2222", hostname="::1", port=2222, slots=3)),
    ("me@[FD00:0:0::7]:1", dict(label="[fd00::7]:1", hostname="fd00::7", user="me", port=1)),
    ("[fe80::1%eth0]:22", dict(hostname="fe80::1%eth0", port=22)),
    ("Node-1.Cluster.LOCAL", dict(label="node-1.cluster.local", hostname="node-1.cluster.local")),
    ("a" * 63 + ".example", dict(hostname="a" * 63 + ".example")),
    ("gpu01 slots=8 servers=8", dict(slots=8, servers=8)),
    ("n slots=4096", dict(slots=4096)),
    ("n slots=007", dict(slots=7)),
    ("svc_user.x-1@n", dict(user="svc_user.x-1")),
]


@pytest.mark.parametrize(("line", "expected"), GOOD_LINES)
def test_good_line(line, expected):
    host = _one(line)
    for name, value in expected.items():
        assert getattr(host, name) == value, name
    assert host.origin == "h:1"


def test_defaults_of_a_bare_host():
    assert _one("node1") == HostSpec(label="node1", hostname="node1", origin="h:1")


def test_comments_blank_lines_crlf_and_bom_keep_line_numbers():
    text = "\ufeff# header\r\n\r\n   \r\nnode1 slots=2 # x\r\n\t# indented comment\r\nnode2\r\n"
    hosts = parse_hostfile(text, "f.txt")
    assert [(h.label, h.slots, h.origin) for h in hosts] == [
        ("node1", 2, "f.txt:4"),
        ("node2", 1, "f.txt:6"),
    ]


def test_file_order_is_kept():
    text = "\n".join(f"n{i} slots={i + 1}" for i in (5, 3, 9, 1))
    assert [h.label for h in parse_hostfile(text)] == ["n5", "n3", "n9", "n1"]


def test_default_filename_in_errors():
    with pytest.raises(HostfileError) as info:
        parse_hostfile("node1 slots=0")
    assert info.value.problems[0].startswith("<hostfile>:1:13: ")


def test_hostfile_error_is_a_config_error():
    with pytest.raises(ConfigError):
        parse_hostfile("")


# ------------------------------------------------------------------ bad lines

# (text, [(location, fragment of the message)]); locations are exact and complete.
BAD = [
    ("", [("h:1:1", "no hosts in this hostfile")]),
    ("# only\n\n  # comments\n", [("h:1:1", "no hosts in this hostfile")]),
    ("node1 slots=0", [("h:1:13", "slots 0 is out of range; expected 1..4096")]),
    ("node1 slots=4097", [("h:1:13", "out of range; expected 1..4096")]),
    ("node1 slots=-1", [("h:1:13", "slots '-1' is not a whole number")]),
    ("node1 slots=+4", [("h:1:13", "not a whole number")]),
    ("node1 slots=1.5", [("h:1:13", "not a whole number")]),
    ("node1 slots=1_0", [("h:1:13", "not a whole number")]),
    ("node1 slots=four", [("h:1:13", "not a whole number")]),
    ("node1 slots=99999999999", [("h:1:13", "too large")]),
    ("node1 slots=", [("h:1:13", "missing slots value; expected a whole number 1..4096")]),
    ("node1 slots", [("h:1:7", "'slots' needs a value; expected slots=N")]),
    ("node1 class", [("h:1:7", "'class' needs a value; expected class=NAME")]),
    ("node1 servers=x", [("h:1:15", "servers 'x' is not a whole number")]),
    ("node1 gpus=two", [("h:1:12", "gpus 'two' is not a whole number")]),
    ("node1 cpus=0", [("h:1:12", "cpus: '0' is not a number of CPUs; expected e.g. 8 or 0.5")]),
    ("node1 cpus=-2", [("h:1:12", "cpus: '-2' is not a number of CPUs")]),
    ("node1 mem=64", [("h:1:11", "mem: 64 is out of range; expected 64M..1P (did you forget G?)")]),
    ("node1 mem=lots", [("h:1:11", "mem: 'lots' is not a size; expected a size such as 512M")]),
    ("node1 mem=2X", [("h:1:11", "mem: '2X' is not a size")]),
    (
        "node1 slots=2 servers=3",
        [("h:1:23", "servers=3 exceeds slots=2; expected servers <= slots")],
    ),
    ("node1 servers=2", [("h:1:15", "exceeds slots=1 (the default when slots= is absent)")]),
    ("node1 class=", [("h:1:13", "invalid class ''")]),
    ("node1 class=v/100", [("h:1:13", "invalid class 'v/100'")]),
    ("node1 spare=yes", [("h:1:7", "'spare' takes no value; expected just 'spare'")]),
    ("node1 spare spare", [("h:1:13", "'spare' given twice on this line (first at col 7)")]),
    ("node1 slots=2 slots=3", [("h:1:15", "'slots' given twice on this line (first at col 7)")]),
    ("node1 class=a class=b", [("h:1:15", "'class' given twice")]),
    (
        "node1 max_slots=4",
        [
            (
                "h:1:7",
                "unknown key 'max_slots' (did you mean 'slots'?); expected one of slots=N, "
                "servers=N, spare, class=NAME",
            )
        ],
    ),
    ("node1 Slots=4", [("h:1:7", "unknown key 'Slots' (did you mean 'slots'?)")]),
    ("node1 foo=1", [("h:1:7", "unknown key 'foo'; expected one of slots=N, servers=N, spare")]),
    ("node1 spar", [("h:1:7", "unexpected 'spar' (did you mean 'spare'?)")]),
    ("node1 node2", [("h:1:7", "unexpected 'node2' (one host per line)")]),
    ("slots=4", [("h:1:1", "line starts with option 'slots=4'; expected [user@]host[:port]")]),
    ("node1:0", [("h:1:7", "port 0 is out of range; expected 1..65535")]),
    ("node1:65536", [("h:1:7", "port 65536 is out of range")]),
    ("node1:", [("h:1:7", "missing port value")]),
    ("node1:ssh", [("h:1:7", "port 'ssh' is not a whole number")]),
    ("me@node1:22x", [("h:1:10", "port '22x' is not a whole number")]),
    ("@node1", [("h:1:1", "empty user name before '@'")]),
    ("bad user@node1", [("h:1:5", "unexpected 'user@node1'")]),
    ("b!d@node1", [("h:1:1", "invalid user name 'b!d'")]),
    ("me@", [("h:1:4", "missing host name")]),
    (":22", [("h:1:1", "missing host name")]),
    ("node_3", [("h:1:1", "invalid host name label 'node_3'")]),
    ("-node", [("h:1:1", "invalid host name label '-node'")]),
    ("node-", [("h:1:1", "invalid host name label 'node-'")]),
    ("rack1.gpu_7.lan", [("h:1:7", "invalid host name label 'gpu_7' in 'rack1.gpu_7.lan'")]),
    ("me@node..x", [("h:1:9", "empty label in 'node..x'")]),
    ("node.", [("h:1:6", "empty label")]),
    ("a" * 64, [("h:1:1", "invalid host name label")]),
    (("a" * 60 + ".") * 5, [("h:1:1", "host name is 305 characters long; expected at most 253")]),
    ("nöde", [("h:1:1", "invalid host name label 'nöde'")]),
    ("10.0.0.256", [("h:1:1", "invalid IPv4 address '10.0.0.256'")]),
    ("10.0.0", [("h:1:1", "invalid IPv4 address")]),
    ("010.0.0.1", [("h:1:1", "invalid IPv4 address")]),
    ("fe80::1 slots=2", [("h:1:1", "'fe80::1' looks like an IPv6 address without brackets")]),
    ("me@fe80::1", [("h:1:4", "without brackets; expected [address] or [address]:port")]),
    ("[fe80::1 slots=2", [("h:1:1", "unclosed '['")]),
    ("[fe80::zz]:22", [("h:1:2", "invalid IPv6 address 'fe80::zz'")]),
    ("[::1]22", [("h:1:6", "unexpected '22' after ']'; expected ':' followed by the port")]),
    ("[::1]:99999", [("h:1:7", "port 99999 is out of range")]),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_bad_input_names_file_line_col(text, expected):
    problems = _problems(text)
    assert len(problems) == len(expected), problems
    for problem, (where, fragment) in zip(problems, expected, strict=True):
        assert problem.startswith(where + ": "), problem
        assert fragment in problem, problem


def test_every_problem_has_an_expectation():
    for problem in _problems("node1 slots=0 bogus=1\n10.0.0.999\n[::1]x\n"):
        assert "; expected" in problem, problem


def test_all_problems_of_the_file_are_reported_at_once_in_file_order():
    text = (
        "node1 slots=4\n"
        "node2 slots=0 foo=1   # two problems on one line\n"
        "# fine comment\n"
        "node3 slots=2\n"
        "node_4 slots=x\n"
        "[::1]:0 spare=1\n"
    )
    problems = _problems(text, "cluster.txt")
    assert [p.split(": ", 1)[0] for p in problems] == [
        "cluster.txt:2:13",
        "cluster.txt:2:15",
        "cluster.txt:5:1",
        "cluster.txt:5:14",
        "cluster.txt:6:7",
        "cluster.txt:6:9",
    ]


def test_problems_are_sorted_by_column_within_a_line():
    # The servers>slots check runs after the per-token checks but points earlier.
    problems = _problems("n slots=1 servers=2 bogus")
    assert [p.split(": ", 1)[0] for p in problems] == ["h:1:19", "h:1:21"]


# ------------------------------------------------------------------ duplicates

DUPLICATES = [
    ("node1\nnode1 slots=2", "h:2:1", "'node1', already defined at h:1"),
    ("node1\nNODE1", "h:2:1", "'node1', already defined at h:1"),
    ("a@node1\nb@node1", "h:2:1", "already defined at h:1"),  # same label
    ("node1:22\n\n  node1:22 spare", "h:3:3", "'node1:22', already defined at h:1"),
    ("[::1]:2222\n[0:0::1]:2222", "h:2:1", "'[::1]:2222', already defined at h:1"),
    ("10.0.0.1\nx\n10.0.0.1", "h:3:1", "'10.0.0.1', already defined at h:1"),
    # A host whose first line had another problem still counts as defined.
    ("node1 slots=0\nnode1 slots=2", "h:2:1", "already defined at h:1"),
]


@pytest.mark.parametrize(("text", "where", "fragment"), DUPLICATES)
def test_duplicate_hosts_are_refused_naming_both_lines(text, where, fragment):
    problems = [p for p in _problems(text) if "duplicate host" in p]
    assert len(problems) == 1, problems
    assert problems[0].startswith(where + ": duplicate host "), problems
    assert fragment in problems[0]
    assert "expected each host once" in problems[0]


def test_same_host_on_different_ports_is_two_hosts():
    hosts = parse_hostfile("node1:2222\nnode1:2223\nnode1\n")
    assert [h.label for h in hosts] == ["node1:2222", "node1:2223", "node1"]


# ------------------------------------------------------------------ inline

INLINE_GOOD = [
    ("node1", [("node1", None, 1)]),
    ("node1:4,node2:4", [("node1", None, 4), ("node2", None, 4)]),
    ("deploy@node1:2, node2", [("node1", "deploy", 2), ("node2", None, 1)]),
    ("[::1]:3,127.0.0.2:2", [("::1", None, 3), ("127.0.0.2", None, 2)]),
    ("me@[fd00::1]", [("fd00::1", "me", 1)]),
]


@pytest.mark.parametrize(("spec", "expected"), INLINE_GOOD)
def test_inline_list(spec, expected):
    hosts = parse_inline(spec)
    assert [(h.label, h.user, h.slots) for h in hosts] == expected
    assert all(h.port is None and h.origin == "-H" and not h.spare for h in hosts)
    assert all(h.hostname == h.label for h in hosts)


INLINE_BAD = [
    ("", [("-H:1:1", "empty host list")]),
    ("   ", [("-H:1:1", "empty host list")]),
    ("node1:0", [("-H:1:7", "slots 0 is out of range; expected 1..4096")]),
    ("node1:x", [("-H:1:7", "slots 'x' is not a whole number")]),
    ("node1:4,,node2", [("-H:1:9", "empty entry between commas")]),
    ("node1:4,", [("-H:1:9", "empty entry between commas")]),
    ("node1:4, node2 slots=2", [("-H:1:15", "space inside an inline entry")]),
    ("node1,node_2,10.1.1.300", [("-H:1:7", "'node_2'"), ("-H:1:14", "invalid IPv4")]),
    ("node1:2,node1:3", [("-H:1:9", "duplicate host 'node1', already defined at -H:1:1")]),
    ("fe80::1:4", [("-H:1:1", "expected [address] or [address]:slots")]),
    ("[::1]4", [("-H:1:6", "expected ':' followed by the slots")]),
]


@pytest.mark.parametrize(("spec", "expected"), INLINE_BAD)
def test_inline_errors_use_dash_h_locations(spec, expected):
    problems = _inline_problems(spec)
    assert len(problems) == len(expected), problems
    for problem, (where, fragment) in zip(problems, expected, strict=True):
        assert problem.startswith(where + ": "), problem
        assert fragment in problem, problem


# ------------------------------------------------------------------ load_hosts


def test_load_hosts_reads_an_existing_file(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("node1 slots=2\nnode2:2200 servers=1 slots=3\n", encoding="utf-8")
    hosts = load_hosts(str(path))
    assert [(h.label, h.slots, h.origin) for h in hosts] == [
        ("node1", 2, f"{path}:1"),
        ("node2:2200", 3, f"{path}:2"),
    ]


def test_load_hosts_prefers_an_existing_file_over_an_inline_reading(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("node1").write_text("other slots=3\n", encoding="utf-8")
    assert [h.label for h in load_hosts("node1")] == ["other"]


def test_load_hosts_errors_in_a_file_name_the_file(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("node1\nnode2 slots=0\n", encoding="utf-8")
    with pytest.raises(HostfileError) as info:
        load_hosts(str(path))
    assert info.value.problems == [f"{path}:2:13: slots 0 is out of range; expected 1..4096"]


def test_load_hosts_inline():
    assert [(h.label, h.slots) for h in load_hosts("node1:4,node2:2")] == [
        ("node1", 4),
        ("node2", 2),
    ]
    assert [h.label for h in load_hosts("127.0.0.1")] == ["127.0.0.1"]


@pytest.mark.parametrize("arg", ["missing.txt", "./hosts", "conf/hosts", "~/no-such-hostfile"])
def test_load_hosts_missing_file(arg, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HostfileError) as info:
        load_hosts(arg)
    (problem,) = info.value.problems
    assert problem.startswith(f"{arg}: hostfile does not exist; expected")
    assert "node1:4,node2:4" in problem


def test_load_hosts_directory_is_refused(tmp_path):
    with pytest.raises(HostfileError, match="is not a regular file"):
        load_hosts(str(tmp_path))


def test_load_hosts_binary_file_is_refused(tmp_path):
    path = tmp_path / "hosts.bin"
    path.write_bytes(b"node1 slots=2\n\xff\xfe\x00garbage\n")
    with pytest.raises(HostfileError, match="not UTF-8 text"):
        load_hosts(str(path))


def test_load_hosts_utf8_bom_file(tmp_path):
    path = tmp_path / "hosts"
    path.write_bytes("\ufeffnode1 slots=2\n".encode())
    assert [h.label for h in load_hosts(str(path))] == ["node1"]


def test_example_hostfile_in_the_repo_parses():
    hosts = load_hosts(str(REPO / "hostfiles" / "example.txt"))
    assert [(h.label, h.user, h.slots, h.servers, h.spare, h.device_class) for h in hosts] == [
        ("node1", None, 4, 0, False, None),
        ("node2:2222", "deploy", 2, 1, False, None),
        ("10.0.0.5", None, 2, 0, False, "v100"),
        ("[fd00::7]:2222", None, 2, 0, False, "v100"),
        ("node3", None, 4, 0, True, None),
        ("node4", None, 4, 0, False, None),
    ]
    assert [(h.cpus, h.memory_bytes) for h in hosts][-2:] == [(0.0, 0), (16.0, 64 << 30)]


# ------------------------------------------------------------------ HostSpec guards


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(slots=0), "slots=0; expected 1..4096"),
        (dict(slots=2, servers=3), "servers=3; expected 0..slots (2)"),
        (dict(servers=-1), "servers=-1"),
        (dict(port=0), "port 0; expected 1..65535"),
    ],
)
def test_hand_built_hostspec_is_checked(kwargs, fragment):
    with pytest.raises(HostfileError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        HostSpec(label="x", hostname="x", **kwargs)


def test_include_and_exclude_select_whole_hosts_in_hostfile_order():
    hosts = parse_hostfile("a slots=2\nb:2222 slots=2\nc slots=2\nd slots=2 spare\n")
    # DeepSpeed's '@' separator, a label with its port, and a bare host name all name hosts.
    kept = select_hosts(hosts, include="d@b:2222,a")
    assert [h.label for h in kept] == ["a", "b:2222", "d"]
    kept = select_hosts(hosts, include="a@b@d", exclude="b")
    assert [h.label for h in kept] == ["a", "d"]
    with pytest.raises(HostfileError) as caught:
        select_hosts(hosts, include="a@@c", exclude="x")
    assert "empty host name" in str(caught.value)
    with pytest.raises(HostfileError) as caught:
        select_hosts(hosts, exclude="x")
    assert "'x' is not a host of the list" in str(caught.value)
    assert "hosts: a, b:2222, c, d" in str(caught.value)
