"""A Kubernetes API emulator for the unmodified ``kubernetes`` clients, where no cluster
can run: API objects and watches over HTTP, a scheduler, a kubelet per node running each
pod's command as local processes, and each flavour's spot reclaim (Karpenter, EKS managed
node groups, GKE graceful node shutdown, AKS). See docs/kubernetes.md."""

from .cluster import KubeCluster
from .config import ClusterConfig, ImagePolicy, Timings
from .pools import NodePool
from .reclaim import Reclaim

__all__ = ["ClusterConfig", "ImagePolicy", "KubeCluster", "NodePool", "Reclaim", "Timings"]
