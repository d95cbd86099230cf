"""backup-restore's scripted builders: a records service, a scheduled backup, a restore.

Each deploys the records workload's server as `builder-app.service`
keeping its records in the brief's data directory, a backup command run by a systemd
timer, and the restore command the referee runs after it destroyed the data directory,
acting only through `Host`. Designed verdicts (rpo: the brief's recovery point
objective):

| builder              | up   | write-read | disk-loss          | host-reboot | second-loss    |
|----------------------|------|------------|--------------------|-------------|----------------|
| reference            | pass | pass       | pass               | pass        | pass           |
| backup-once          | pass | pass       | record_missing     |             |                |
| backup-in-datadir    | pass | pass       | record_missing     |             |                |
| backup-not-enabled   | pass | pass       | pass               | pass        | record_missing |
| stores-elsewhere     | pass | pass       | loss_not_effective |             |                |
| restore-broken       | pass | pass       | restore_failed     |             |                |

`reference` snapshots the data directory every 2 s (`cp -a` to a new directory, synced,
then an atomic switch of a `latest` link; the three newest kept) and restores the newest
snapshot. `backup-once` takes one snapshot at install and has no timer; `backup-in-datadir`
keeps its snapshots inside the data directory, which the loss takes with it;
`backup-not-enabled` starts its timer without enabling it, so backups stop at the first
boot after the install (the first loss passes, the second finds nothing new);
`stores-elsewhere` keeps its records in /srv, outside the data directory, so the loss
changes nothing (and its "restore" does nothing); `restore-broken` looks for its backups
in the wrong directory and exits 1.
"""

from __future__ import annotations

from typing import ClassVar

from opsarena.agents.scripted import IdleBuilder, ScriptedBuilder
from opsarena.agents.scripted.builders import SERVER_SCRIPT, records_server_source
from opsarena.agents.scripted.deploy import ServiceTarget, activation_script
from opsarena.hosts import ExecResult, Host

DATA_DIR = "/var/lib/records"
BACKUP_DIR = "/var/backups/records"
RESTORE_COMMAND = "/usr/local/sbin/restore-records"
BACKUP_COMMAND = "/usr/local/sbin/backup-records"
BACKUP_EVERY_S = 2


def service_unit(target: ServiceTarget, script: str, data_dir: str) -> str:
    """The records service, root, its records in `data_dir` (created at start)."""
    return (
        "[Unit]\n"
        "Description=records service (opsarena scripted backup-restore builder)\n\n"
        "[Service]\n"
        "Type=exec\n"
        f"ExecStartPre=/bin/mkdir -p {data_dir}\n"
        f"ExecStart=/usr/bin/python3 {script} --port {target.port} --storage {data_dir} "
        "--health-body ready --max-body 8388608\n"
        "Restart=always\n"
        "RestartSec=200ms\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def backup_script(data_dir: str, backup_dir: str) -> str:
    """Snapshot the records (the plain files) of `data_dir` into a new directory under
    `backup_dir`, make it durable, then switch `latest` to it atomically; keep the three
    newest. An empty data directory never replaces a snapshot that has records: after a
    disk loss the timer may run before the restore does."""
    return (
        "#!/bin/sh\n"
        "set -eu\n"
        f'data="{data_dir}"\n'
        f'dest="{backup_dir}"\n'
        'mkdir -p "$dest" "$data"\n'
        'if [ -z "$(ls "$data")" ] && [ -d "$dest/latest" ] '
        '&& [ -n "$(ls "$dest/latest")" ]; then exit 0; fi\n'
        'snap="$dest/snap-$(date +%s%N)"\n'
        'mkdir "$snap.tmp"\n'
        'find "$data" -maxdepth 1 -type f ! -name ".*" -exec cp -a -t "$snap.tmp" {} +\n'
        'sync -f "$snap.tmp"\n'
        'mv "$snap.tmp" "$snap"\n'
        'ln -sfn "$snap" "$dest/latest.tmp"\n'
        'mv -T "$dest/latest.tmp" "$dest/latest"\n'
        'sync -f "$dest"\n'
        'ls -1d "$dest"/snap-* | grep -v "[.]tmp$" | sort | head -n -3 | xargs -r rm -rf\n'
    )


def restore_script(
    target: ServiceTarget, data_dir: str, backup_dir: str, *, tolerant: bool = False
) -> str:
    """Stop the service, put the newest snapshot back, start it, wait until it answers.
    `tolerant` (a flaw): a missing snapshot restores nothing instead of failing."""
    missing = (
        'echo "no backup in $latest: nothing restored" >&2; latest=/nonexistent'
        if tolerant
        else 'echo "no backup in $latest" >&2; exit 1'
    )
    return (
        "#!/bin/sh\n"
        "set -eu\n"
        f'latest="{backup_dir}/latest"\n'
        f'[ -d "$latest" ] || {{ {missing}; }}\n'
        f"systemctl stop {target.unit}\n"
        f'mkdir -p "{data_dir}"\n'
        f'find "{data_dir}" -mindepth 1 -delete\n'
        f'[ ! -d "$latest" ] || cp -a "$latest"/. "{data_dir}"/\n'
        f'sync -f "{data_dir}"\n'
        f"systemctl start {target.unit}\n"
        "for _ in $(seq 200); do\n"
        f"  curl -s -o /dev/null --max-time 1 {target.health_url} && exit 0\n"
        "  sleep 0.1\n"
        "done\n"
        'echo "the service did not answer after the restore" >&2\n'
        "exit 1\n"
    )


def timer_units() -> tuple[str, str]:
    """The backup service and its timer (every `BACKUP_EVERY_S` seconds, from boot)."""
    service = (
        "[Unit]\nDescription=snapshot of the records\n\n"
        f"[Service]\nType=oneshot\nExecStart={BACKUP_COMMAND}\n"
    )
    timer = (
        "[Unit]\nDescription=snapshot the records every few seconds\n\n"
        "[Timer]\n"
        "OnBootSec=1s\n"
        f"OnUnitActiveSec={BACKUP_EVERY_S}s\n"
        "AccuracySec=100ms\n\n"
        "[Install]\nWantedBy=timers.target\n"
    )
    return service, timer


class BackupBuilder(ScriptedBuilder):
    """Deploys the service, the backup and the restore, with the subclass's one flaw."""

    flaw: ClassVar[str | None] = None

    async def deploy(
        self, host: Host, target: ServiceTarget, *, wait_seconds: float
    ) -> ExecResult | None:
        data_dir = "/srv/records" if self.flaw == "stores-elsewhere" else DATA_DIR
        backup_dir = f"{DATA_DIR}/.backups" if self.flaw == "in-datadir" else BACKUP_DIR
        script_path = f"{target.program_dir}/{SERVER_SCRIPT}"
        await host.write_file(script_path, records_server_source())
        unit = service_unit(target, script_path, data_dir)
        await host.write_file(target.unit_path, unit.encode())
        backup = backup_script(data_dir, backup_dir)
        await host.write_file(BACKUP_COMMAND, backup.encode(), mode=0o755)
        if self.flaw == "stores-elsewhere":
            restore = "#!/bin/sh\n# the records are not in the data directory\nexit 0\n"
        elif self.flaw == "broken-restore":
            restore = restore_script(target, data_dir, "/var/backups/record")
        else:
            restore = restore_script(
                target, data_dir, backup_dir, tolerant=self.flaw == "in-datadir"
            )
        await host.write_file(RESTORE_COMMAND, restore.encode(), mode=0o755)
        service, timer = timer_units()
        await host.write_file("/etc/systemd/system/records-backup.service", service.encode())
        if self.flaw != "once":
            await host.write_file("/etc/systemd/system/records-backup.timer", timer.encode())
        timers = {
            "once": "",
            "not-enabled": "systemctl start records-backup.timer\n",
        }.get(str(self.flaw), "systemctl enable --now records-backup.timer\n")
        started = await host.exec(
            activation_script(target, enable=True, wait_seconds=wait_seconds),
            timeout=wait_seconds + 30.0,
        )
        if not started.ok:
            return started
        # The first snapshot at once (the timer keeps them coming); made durable.
        # The brief's data directory exists whatever the flaw (stores-elsewhere leaves it
        # empty: its records go to /srv).
        return await host.exec(
            f"set -eu\nmkdir -p {DATA_DIR}\nsystemctl daemon-reload\n{BACKUP_COMMAND}\n"
            f"{timers}sync\n",
            timeout=60.0,
        )

    def describe(self, target: ServiceTarget) -> str:
        flaw = f"; flaw {self.flaw}" if self.flaw else ""
        return (
            f"{self.name}: records in {DATA_DIR}, snapshots every {BACKUP_EVERY_S} s to "
            f"{BACKUP_DIR}, restore {RESTORE_COMMAND}{flaw}"
        )


class BackupReferenceBuilder(BackupBuilder):
    """Snapshots every 2 s, restores the newest: passes every milestone."""

    name = "reference"


class BackupOnceBuilder(BackupBuilder):
    """One snapshot at install, no timer: the records written later are never saved."""

    name = "backup-once"
    flaw = "once"


class BackupInDataDirBuilder(BackupBuilder):
    """Snapshots kept inside the data directory: the disk loss takes them too."""

    name = "backup-in-datadir"
    flaw = "in-datadir"


class BackupNotEnabledBuilder(BackupBuilder):
    """The timer is started, not enabled: after the first boot no backup runs any more."""

    name = "backup-not-enabled"
    flaw = "not-enabled"


class StoresElsewhereBuilder(BackupBuilder):
    """Records kept in /srv, outside the data directory the brief names."""

    name = "stores-elsewhere"
    flaw = "stores-elsewhere"


class RestoreBrokenBuilder(BackupBuilder):
    """Backs up well, but the restore looks in the wrong place and exits 1."""

    name = "restore-broken"
    flaw = "broken-restore"


BUILDERS: tuple[type[ScriptedBuilder], ...] = (
    BackupReferenceBuilder,
    IdleBuilder,
    BackupOnceBuilder,
    BackupInDataDirBuilder,
    BackupNotEnabledBuilder,
    StoresElsewhereBuilder,
    RestoreBrokenBuilder,
)
