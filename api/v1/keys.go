package v1

const (
	// WeightsCacheReadyLabelPrefix, followed by a ModelDataCacheConfig's UID, is the key of the
	// node label (value "true") on the nodes that hold that weights cache, verified.
	WeightsCacheReadyLabelPrefix = "inference.sagemaker.aws.amazon.com/weights-cache-ready."
	// ImageCacheReadyLabelPrefix, followed by an InferenceImageCache's UID, is the key of the node
	// label (value "true") on the nodes that hold that image, pulled and pinned.
	ImageCacheReadyLabelPrefix = "inference.sagemaker.aws.amazon.com/image-cache-ready."
	// LabelTrue is the value of the cache-ready node labels.
	LabelTrue = "true"

	// CacheFinalizer keeps a cache object until its files, labels and per-node state are gone.
	CacheFinalizer = "inference.sagemaker.aws.amazon.com/cache-cleanup"
	// ParentFinalizer keeps a parent until its references to shared caches are released.
	ParentFinalizer = "inference.sagemaker.aws.amazon.com/release-caches"

	// APILabel (value "true") marks prewarm's own CRDs: a CRD of this group without it was
	// installed by another operator (the SageMaker HyperPod inference operator's chart).
	APILabel = "prewarm.io/api"

	// InstanceTypeLabel is the well-known node label that instanceType and instanceTypes match.
	InstanceTypeLabel = "node.kubernetes.io/instance-type"

	// DefaultOperatorNamespace is where shared InferenceImageCache objects live.
	DefaultOperatorNamespace = "hyperpod-inference-system"
	// DefaultWeightsCacheHostPath is the weights cache root when hostPath is not given.
	DefaultWeightsCacheHostPath = "/opt/dlami/nvme"
	// DefaultModelMountPath is where the inference container finds the model when
	// modelVolumeMount.mountPath is not given.
	DefaultModelMountPath = "/opt/ml/model"
)

// WeightsCacheReadyLabel returns the node label key for the weights cache with this UID.
func WeightsCacheReadyLabel(uid string) string { return WeightsCacheReadyLabelPrefix + uid }

// ImageCacheReadyLabel returns the node label key for the image cache with this UID.
func ImageCacheReadyLabel(uid string) string { return ImageCacheReadyLabelPrefix + uid }
