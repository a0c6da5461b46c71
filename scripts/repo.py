#!/usr/bin/env python3
"""make repo: a static, signed apt repository of the packages `make packages` left (CONTRACT §14, "A
repository, as fleets install"), made by reprepro:

  REPO_DIR/dists/bookworm/{InRelease,Release,Release.gpg,main/binary-ARCH/Packages{,.gz,.xz},...}
  REPO_DIR/dists/trixie/...
  REPO_DIR/pool/main/g/gpunode-agent/gpunode-agent_V-1~deb12u1_ARCH.deb, ..._V-1~deb13u1_ARCH.deb
  REPO_DIR/gpunode-archive-keyring.gpg     the signing key's public half, for signed-by=

Each release's suite (its codename) holds that release's package, component main. The repository
is made again from nothing each time (reprepro's database is scratch): the packages alone make it,
and the same packages give the same pool and the same indices (only Release's Date and the
signatures differ from one run to the next).

The key: --key NAME (make repo REPO_KEY=NAME) names a secret key of the caller's GnuPG keyring
($GNUPGHOME, else ~/.gnupg), by fingerprint, key id or user id; without it, the key made for the
purpose in --key-home (default repo-key, a GnuPG home of its own: an Ed25519 signing key with
no passphrase, made the first time and kept, so that the hosts' keyring stays valid; `make clean`
deletes it, and a new one must then be given to every host).

Usage: repo.py PACKAGES_DIR REPO_DIR [--key NAME] [--key-home DIR] [--release SUITE ...]
Needs reprepro and gpg (scripts/install-deps.sh).
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import debroot  # noqa: E402

KEYRING = "gpunode-archive-keyring.gpg"
MADE_KEY_UID = "gpunode archive signing key (made by make repo)"


def say(text):
    print(text, flush=True)


def run(argv, what, env=None, **kw):
    """argv; an Error naming `what`, with what it said, when it fails."""
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, **kw)
    if p.returncode != 0:
        raise debroot.Error(f"{what}: {' '.join(argv)}: exit {p.returncode}: {(p.stderr or p.stdout).strip()[-2000:]}")
    return p


def gpg_env(home):
    env = dict(os.environ)
    if home:
        env["GNUPGHOME"] = home
    return env


def secret_key(name, env, where):
    """The fingerprint of the one secret signing key `name` names in the keyring of `env`."""
    p = subprocess.run(["gpg", "--batch", "--with-colons", "--list-secret-keys", "--", name], capture_output=True,
                       text=True, env=env, timeout=60)
    keys, fprs = [], []
    for line in p.stdout.splitlines():
        fields = line.split(":")
        if fields[0] == "sec":
            keys.append(fields)
        elif fields[0] == "fpr" and len(fprs) < len(keys):
            fprs.append(fields[9])
    if len(keys) != 1:
        raise debroot.Error(f"{where}: {name!r} names {len(keys)} secret keys in {env.get('GNUPGHOME', '~/.gnupg')}"
                            f"{'' if keys else ' (gpg --list-secret-keys shows what there is)'}: want exactly one")
    if "s" not in keys[0][11].lower() or keys[0][1] in ("r", "e", "d"):
        raise debroot.Error(f"{where}: {name!r} ({fprs[0]}) cannot sign (capabilities {keys[0][11]!r}, "
                            f"validity {keys[0][1]!r})")
    return fprs[0]


def made_key(home):
    """The key made for the purpose in `home`, made now if there is none."""
    env = gpg_env(home)
    if not os.path.isdir(home) or not glob.glob(os.path.join(home, "private-keys-v1.d", "*.key")):
        os.makedirs(home, mode=0o700, exist_ok=True)
        os.chmod(home, 0o700)
        run(["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "", "--quick-generate-key",
             MADE_KEY_UID, "ed25519", "sign", "never"], "making the repository's key", env=env)
        say(f"# repo: made a signing key for the purpose in {home} (keep it: hosts trust its public half)")
    return secret_key(MADE_KEY_UID, env, home)


def distributions(suites, arch, fpr):
    stanzas = []
    for suite in suites:
        number = debroot.RELEASES[suite]
        stanzas.append(f"""Origin: gpunode
Label: gpunode
Codename: {suite}
Architectures: {arch}
Components: main
Description: gpunode-agent for Debian {number} ({suite})
DebIndices: Packages Release . .gz .xz
SignWith: {fpr}
""")
    return "\n".join(stanzas)


def make(packages, repo, fpr, env, suites):
    """The repository in `repo`, made anew in a scratch directory beside it, then put in place."""
    arch = run(["dpkg", "--print-architecture"], "dpkg").stdout.strip()
    debs = {}
    for suite in suites:
        found = sorted(glob.glob(os.path.join(packages, suite, "gpunode-agent_*.deb")))
        if len(found) != 1:
            raise debroot.Error(f"{os.path.join(packages, suite)}: want one gpunode-agent_*.deb, found "
                                f"{[os.path.basename(f) for f in found]} (make packages makes it)")
        debs[suite] = found[0]
    parent = os.path.dirname(os.path.abspath(repo)) or "."
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".repo-", dir=parent)
    try:
        conf, out = os.path.join(work, "conf"), os.path.join(work, "repo")
        os.makedirs(conf)
        with open(os.path.join(conf, "distributions"), "w", encoding="utf-8") as f:
            f.write(distributions(suites, arch, fpr))
        base = ["reprepro", "--silent", "--basedir", work, "--confdir", conf, "--dbdir", os.path.join(work, "db"),
                "--outdir", out]
        for suite, deb in debs.items():
            run([*base, "includedeb", suite, deb], f"reprepro: {suite}", env=env)
        run(["gpg", "--batch", "--yes", "--output", os.path.join(out, KEYRING), "--export", fpr],
            "exporting the key's public half", env=env)
        for suite in suites:  # as apt will: each release's InRelease and Release.gpg by the keyring alone
            dist = os.path.join(out, "dists", suite)
            run(["gpgv", "--keyring", os.path.join(out, KEYRING), os.path.join(dist, "InRelease")],
                f"{dist}/InRelease does not verify")
            run(["gpgv", "--keyring", os.path.join(out, KEYRING), os.path.join(dist, "Release.gpg"),
                 os.path.join(dist, "Release")], f"{dist}/Release.gpg does not verify")
        shutil.rmtree(repo, ignore_errors=True)
        os.rename(out, repo)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packages")
    ap.add_argument("repo")
    ap.add_argument("--key", default=os.environ.get("REPO_KEY", ""))
    ap.add_argument("--key-home", default="repo-key")
    ap.add_argument("--release", action="append", choices=sorted(debroot.RELEASES))
    args = ap.parse_args()
    suites = args.release or list(debroot.RELEASES)
    home = None
    try:
        for tool in ("reprepro", "gpg", "gpgv"):
            if shutil.which(tool) is None:
                raise debroot.Error(f"{tool} is missing (scripts/install-deps.sh installs it)")
        if args.key:
            env = gpg_env(None)
            fpr = secret_key(args.key, env, "REPO_KEY")
            say(f"# repo: signing with REPO_KEY {args.key} ({fpr})")
        else:
            home = os.path.abspath(args.key_home)
            env = gpg_env(home)
            fpr = made_key(home)
            say(f"# repo: signing with the key made for the purpose, {fpr} ({home})")
        make(os.path.abspath(args.packages), os.path.abspath(args.repo), fpr, env, suites)
    except (debroot.Error, subprocess.TimeoutExpired) as e:
        print(f"repo: {e}", file=sys.stderr)
        return 1
    finally:
        if home is not None:  # the agent gpg started for the key made here: nothing left running
            subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=gpg_env(home), capture_output=True)
    say(f"# repo: {os.path.relpath(args.repo)}, signed by {fpr}:")
    for path in sorted(glob.glob(os.path.join(args.repo, "**"), recursive=True)):
        if os.path.isfile(path):
            say(f"#   {os.path.getsize(path):>9}  {os.path.relpath(path, args.repo)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
