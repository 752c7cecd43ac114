"""The complete-fit tiers: ``pair`` (whole short fits, the decisive claim) and ``stages`` (a diagnostic)."""
