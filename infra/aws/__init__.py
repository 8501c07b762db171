"""The AWS layer: network, EKS, the core node group, Karpenter's GPU spot pools, ECR and S3, as Pulumi components.
It imports only the kernel (``infra.kernel``)."""
