"""A generator module that names a package this machine does not have (for the exit status 3
test of verify_distribution.py --generator)."""

REQUIRES = ("a_package_that_is_not_installed",)


def factory(target_dir, draft_dir):
    raise AssertionError("never called: the missing package is reported first")
