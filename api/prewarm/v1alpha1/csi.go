package v1alpha1

import corev1 "k8s.io/api/core/v1"

// prewarm's CSI driver: the node agent serves each pod the one weights cache it asks for, or
// the one FSx directory its cold download reads, as a read-only CSI ephemeral volume.
const (
	// CSIDriverName is the name of prewarm's CSI driver (its CSIDriver object, and the driver of
	// the inference pods' model volume).
	CSIDriverName = "csi.prewarm.io"
	// VolumeAttributeCacheUID is the volume attribute naming the cache a volume mounts: the
	// ModelDataCacheConfig's UID. The pod's namespace must be the cache's.
	VolumeAttributeCacheUID = "cacheUID"
	// VolumeAttributeCacheName is the cache's name, for people reading the pod (the UID decides).
	VolumeAttributeCacheName = "cacheName"
	// VolumeAttributeCache names, instead of a UID, the cache a volume mounts by a stable name:
	// a ModelWeightsCacheConfig of the pod's own namespace (a user's standalone one, or the view
	// prewarm writes beside a parent's ModelDataCacheConfig, of that cache's name). The name is
	// looked up in the pod's namespace only, so a pod can name no other namespace's cache.
	VolumeAttributeCache = "cache"
	// VolumeAttributeFSxFileSystemID and VolumeAttributeFSxPath name, instead of a cache, an
	// FSx file system and a directory in it (the model's): the volume is that directory, read
	// from the file system's mount on the node, when a sourceAccess rule allows it for the pod's
	// namespace. The init container of a pod without a weights cache reads an FSx model there.
	VolumeAttributeFSxFileSystemID = "fsxFileSystemId"
	VolumeAttributeFSxPath         = "fsxPath"
)

// VolumeCacheUID returns the cache a pod volume names, when it is prewarm's CSI volume, or "".
func VolumeCacheUID(v corev1.Volume) string {
	if v.CSI == nil || v.CSI.Driver != CSIDriverName {
		return ""
	}
	return v.CSI.VolumeAttributes[VolumeAttributeCacheUID]
}

// VolumeCacheByName returns the cache name a pod volume gives (VolumeAttributeCache), when it is
// prewarm's CSI volume and names no UID, or "".
func VolumeCacheByName(v corev1.Volume) string {
	if v.CSI == nil || v.CSI.Driver != CSIDriverName || v.CSI.VolumeAttributes[VolumeAttributeCacheUID] != "" {
		return ""
	}
	return v.CSI.VolumeAttributes[VolumeAttributeCache]
}
