"""Scale-out: the device mesh, the logical-axis rules table, where arrays live, multi-host."""

from hone.parallel.distributed import initialize
from hone.parallel.layout import Layout, logical_names
from hone.parallel.mesh import AXES, build_mesh
from hone.parallel.rules import RULES, partition_spec

__all__ = ["AXES", "Layout", "RULES", "build_mesh", "initialize", "logical_names",
           "partition_spec"]
