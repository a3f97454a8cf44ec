"""Starting nodes under launchers: environment detection (pure) and the config it implies."""

from .bootstrap import config_from_env, detect_launch
from .env import LaunchInfo, detect, expand_nodelist, expand_tasks_per_node

__all__ = ["LaunchInfo", "config_from_env", "detect", "detect_launch", "expand_nodelist", "expand_tasks_per_node"]
