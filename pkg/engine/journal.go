package engine

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// The journal records, in the partial directory, which byte ranges of which files are written
// and which files are verified, so a download killed at any point resumes without fetching
// those bytes again. Records are appended after the bytes are written (they survive the death
// of the process: the kernel holds the data). Every so often the filesystem is synced and a
// "S" record written; after a reboot only records before the last "S" are trusted.
//
//	{"plan":"<sha256 of the listing>","boot":"<boot id>"}
//	W <file index> <offset> <length> [<crc of the part, hex>]
//	C <file index> <offset> <crc32c of the part, hex>   (what the part is offered to peers with)
//	V <file index>
//	X <file index>      (the file failed verification: forget it)
//	S

type journalHeader struct {
	Plan string `json:"plan"`
	Boot string `json:"boot"`
}

// coverage is the written ranges of one file, merged.
type coverage struct{ spans [][2]int64 }

func (c *coverage) add(off, n int64) {
	c.spans = append(c.spans, [2]int64{off, off + n})
	sort.Slice(c.spans, func(i, j int) bool { return c.spans[i][0] < c.spans[j][0] })
	merged := c.spans[:1]
	for _, s := range c.spans[1:] {
		last := &merged[len(merged)-1]
		if s[0] <= last[1] {
			last[1] = max(last[1], s[1])
		} else {
			merged = append(merged, s)
		}
	}
	c.spans = merged
}

// covers reports whether [off, off+n) is written.
func (c *coverage) covers(off, n int64) bool {
	for _, s := range c.spans {
		if s[0] <= off && off+n <= s[1] {
			return true
		}
	}
	return false
}

// partCRC is the CRC of one written part, for verification without reading the file back.
type partCRC struct {
	off, n int64
	crc    uint64
}

// resumeState is what a journal says was done before.
type resumeState struct {
	written  map[int]*coverage
	verified map[int]bool
	// fromPeers are the files some of whose parts came from peers.
	fromPeers map[int]bool
	crcs      map[int][]partCRC
	// partCRC are the written parts' CRC32Cs, by file and offset.
	partCRC map[partKey]uint32
}

type partKey struct {
	file int
	off  int64
}

func newResumeState() resumeState {
	return resumeState{written: map[int]*coverage{}, verified: map[int]bool{}, fromPeers: map[int]bool{}, crcs: map[int][]partCRC{}, partCRC: map[partKey]uint32{}}
}

func planHash(files []source.File, revision string) string {
	h := sha256.New()
	fmt.Fprintf(h, "rev %q\n", revision)
	for _, f := range files {
		fmt.Fprintf(h, "%q %d %q\n", f.Path, f.Size, f.Version)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func bootID() string {
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// readJournal returns the state a journal records for this plan, or ok=false when there is no
// journal or it belongs to another plan.
func readJournal(path, plan string) (st resumeState, ok bool, err error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return st, false, nil
	}
	if err != nil {
		return st, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return st, false, nil
	}
	var hdr journalHeader
	if json.Unmarshal(sc.Bytes(), &hdr) != nil || hdr.Plan != plan {
		return st, false, nil
	}
	// Records after the last sync mark are trusted only if the machine has not restarted since
	// they were written: a crash of the process keeps them in the page cache, a power loss
	// may not.
	var trusted, pending []journalRecord
	for sc.Scan() {
		r, ok := parseRecord(sc.Text())
		switch {
		case !ok:
			// a torn last line, or one this version does not know
		case r.kind == 'S':
			trusted = append(trusted, pending...)
			pending = pending[:0]
		default:
			pending = append(pending, r)
		}
	}
	if hdr.Boot != "" && hdr.Boot == bootID() {
		trusted = append(trusted, pending...)
	}
	st = newResumeState()
	for _, r := range trusted {
		st.apply(r)
	}
	return st, true, sc.Err()
}

// journalRecord is one line of a journal: S (synced), W file off n [crc] (written), C file off
// crc32c (a part's CRC32C), P file (a part of it came from a peer), V file (verified), X file
// (reset).
type journalRecord struct {
	kind   byte
	idx    int
	off, n int64
	crc    uint64
	hasCRC bool
}

func parseRecord(line string) (journalRecord, bool) {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return journalRecord{}, false
	}
	switch fields[0] {
	case "S":
		return journalRecord{kind: 'S'}, len(fields) == 1
	case "W":
		if len(fields) != 4 && len(fields) != 5 {
			return journalRecord{}, false
		}
		idx, err1 := strconv.Atoi(fields[1])
		off, err2 := strconv.ParseInt(fields[2], 10, 64)
		n, err3 := strconv.ParseInt(fields[3], 10, 64)
		r := journalRecord{kind: 'W', idx: idx, off: off, n: n}
		var err4 error
		if len(fields) == 5 {
			r.crc, err4 = strconv.ParseUint(fields[4], 16, 64)
			r.hasCRC = err4 == nil
		}
		return r, err1 == nil && err2 == nil && err3 == nil && err4 == nil
	case "C":
		if len(fields) != 4 {
			return journalRecord{}, false
		}
		idx, err1 := strconv.Atoi(fields[1])
		off, err2 := strconv.ParseInt(fields[2], 10, 64)
		crc, err3 := strconv.ParseUint(fields[3], 16, 32)
		return journalRecord{kind: 'C', idx: idx, off: off, crc: crc}, err1 == nil && err2 == nil && err3 == nil
	case "V", "X", "P":
		if len(fields) != 2 {
			return journalRecord{}, false
		}
		idx, err := strconv.Atoi(fields[1])
		return journalRecord{kind: fields[0][0], idx: idx}, err == nil
	}
	return journalRecord{}, false
}

func (st *resumeState) apply(r journalRecord) {
	switch r.kind {
	case 'W':
		c := st.written[r.idx]
		if c == nil {
			c = &coverage{}
			st.written[r.idx] = c
		}
		c.add(r.off, r.n)
		if r.hasCRC {
			st.crcs[r.idx] = append(st.crcs[r.idx], partCRC{r.off, r.n, r.crc})
		}
	case 'C':
		st.partCRC[partKey{r.idx, r.off}] = uint32(r.crc)
	case 'V':
		st.verified[r.idx] = true
	case 'P':
		st.fromPeers[r.idx] = true
	case 'X':
		delete(st.written, r.idx)
		delete(st.verified, r.idx)
		delete(st.crcs, r.idx)
		delete(st.fromPeers, r.idx)
		for k := range st.partCRC {
			if k.file == r.idx {
				delete(st.partCRC, k)
			}
		}
	}
}

// journal appends records. It is used from one goroutine.
type journal struct {
	f *os.File
	w *bufio.Writer
}

func createJournal(path, plan string) (*journal, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	hdr, _ := json.Marshal(journalHeader{Plan: plan, Boot: bootID()})
	j := &journal{f: f, w: bufio.NewWriter(f)}
	_, _ = j.w.Write(hdr) // bufio errors are sticky: flush reports them
	_ = j.w.WriteByte('\n')
	return j, j.flush()
}

func appendJournal(path string) (*journal, error) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	// A torn last line from a killed writer would glue onto the next record: start afresh.
	j := &journal{f: f, w: bufio.NewWriter(f)}
	_ = j.w.WriteByte('\n')
	return j, j.flush()
}

// Record writers: a write error stays in the bufio.Writer and flush returns it.

func (j *journal) written(rec record) {
	if rec.peer {
		_, _ = fmt.Fprintf(j.w, "P %d\n", rec.file) // before the part: a torn journal errs on the side of distrust
	}
	if rec.hasCRC {
		_, _ = fmt.Fprintf(j.w, "W %d %d %d %x\n", rec.file, rec.off, rec.n, rec.crc)
	} else {
		_, _ = fmt.Fprintf(j.w, "W %d %d %d\n", rec.file, rec.off, rec.n)
	}
	_, _ = fmt.Fprintf(j.w, "C %d %d %x\n", rec.file, rec.off, rec.part)
}

func (j *journal) verified(idx int) { _, _ = fmt.Fprintf(j.w, "V %d\n", idx) }

func (j *journal) reset(idx int) { _, _ = fmt.Fprintf(j.w, "X %d\n", idx) }

func (j *journal) synced() { _, _ = j.w.WriteString("S\n") }

// flush hands buffered records to the kernel: enough to survive the process being killed.
func (j *journal) flush() error { return j.w.Flush() }

func (j *journal) close() error {
	err := j.flush()
	if cerr := j.f.Close(); err == nil {
		err = cerr
	}
	return err
}
