#!/usr/bin/env python
"""Django's command-line utility for the Merritt queue console."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mrtadmin.settings")
    from django.core.management import execute_from_command_line

    from mrtadmin import local

    # The one deliberate moment a command-line process creates MRT_VAR_DIR and the generated
    # secret key (importing the settings creates nothing; see mrtadmin/local.py).
    # A bad setting, or a folder that cannot be written, ends it in one line naming it.
    local.settings_or_exit("manage.py", create=True)
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
