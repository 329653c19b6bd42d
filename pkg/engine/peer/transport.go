package peer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prewarm/prewarm/pkg/engine"
)

type incompatibleError struct{ msg string }

func (s *Swarm) have(p *peerState, after string) (*HaveResponse, error) {
	url := p.URL + Prefix + s.opts.Key + "/have?revision=" + s.plan.Revision
	if after != "" {
		url += "&after=" + after
	}
	ctx, cancel := context.WithTimeout(s.ctx, longPoll+10*time.Second)
	defer cancel()
	resp, err := s.get(ctx, url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(resp)
	}
	h := &HaveResponse{}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(h); err != nil {
		return nil, err
	}
	if h.PartSize != s.plan.PartSize || h.Parts != s.plan.Parts() || len(h.Held) != (h.Parts+7)/8 ||
		len(h.Reading) != 0 && len(h.Reading) != len(h.Held) {
		return nil, &incompatibleError{fmt.Sprintf("%s cuts the model into %d parts of %d bytes, this node into %d of %d",
			p.Name, h.Parts, h.PartSize, s.plan.Parts(), s.plan.PartSize)}
	}
	return h, nil
}

func (s *Swarm) get(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	tok, err := s.opts.Token()
	if err != nil {
		return nil, fmt.Errorf("reading the peer token: %w", err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	return s.opts.Client.Do(req)
}

func statusError(resp *http.Response) error {
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return &StatusError{Code: resp.StatusCode, Message: string(msg)}
}

// StatusError is a peer's answer other than 200.
type StatusError struct {
	Code    int
	Message string
}

// fetch asks p for part i. The body must arrive within SlowPart, and no 2 × Stall may pass
// without a byte of it (errStalled: the peer is paused, or cut off).
func (s *Swarm) fetch(ctx context.Context, p *peerState, i int) (engine.PeerPart, error) {
	ctx, cancelSlow := context.WithTimeout(ctx, s.opts.SlowPart)
	ctx, cancelIdle := context.WithCancelCause(ctx)
	idle := time.AfterFunc(2*s.opts.Stall, func() { cancelIdle(errStalled) })
	cancel := func() { idle.Stop(); cancelIdle(nil); cancelSlow() }
	p.inflight.Add(1)
	resp, err := s.get(ctx, fmt.Sprintf("%s%s%s/parts/%d?revision=%s", p.URL, Prefix, s.opts.Key, i, s.plan.Revision))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = statusError(resp)
		resp.Body.Close()
	}
	var crc uint64
	if err == nil {
		if crc, err = strconv.ParseUint(resp.Header.Get(CRCHeader), 16, 32); err != nil {
			resp.Body.Close()
			err = fmt.Errorf("%s sent part %d without its checksum", p.Name, i)
		}
	}
	if err != nil {
		if errors.Is(context.Cause(ctx), errStalled) {
			err = fmt.Errorf("%s: %w", p.Name, errStalled)
		}
		p.inflight.Add(-1)
		cancel()
		<-s.streams
		return engine.PeerPart{}, err
	}
	body := &partBody{ReadCloser: resp.Body, done: func() { p.inflight.Add(-1); cancel(); <-s.streams }, ctx: ctx,
		moved: func() { idle.Reset(2 * s.opts.Stall) }}
	return engine.PeerPart{Body: body, CRC32C: uint32(crc), Peer: p.Name}, nil
}

// partBody is a part's response body; closing it ends the request.
type partBody struct {
	io.ReadCloser
	ctx   context.Context
	done  func()
	moved func() // called with every byte that arrives
	once  sync.Once
}

var (
	errSlow    = errors.New("the peer sent the part too slowly")
	errStalled = errors.New("the peer stopped sending")
)

func (e *incompatibleError) Error() string { return e.msg }

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Code, e.Message) }

func (b *partBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.moved()
	}
	if err != nil {
		switch cause := context.Cause(b.ctx); {
		case errors.Is(cause, errStalled):
			err = errStalled
		case errors.Is(cause, context.DeadlineExceeded):
			err = errSlow
		}
	}
	return n, err
}

func (b *partBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.done)
	return err
}
